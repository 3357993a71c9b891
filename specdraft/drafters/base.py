"""The drafter contract: a request lifecycle over a fast core, and the `Draft` value it proposes.

Lifecycle per request: `begin` with the prompt, then each step `propose` (batched over the active
requests) and `accept` with the tokens that joined the context, and finally `end`. A drafter learns
how much of its draft was accepted by comparing what it proposed with what `accept` receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

from specdraft.params import SamplingParams

if TYPE_CHECKING:  # the protocol module stays light: listing drafters must not import torch
    import torch


@dataclass(frozen=True)
class Draft:
    """Up to k proposed tokens for one request.

    `probs` is q, the distribution each token was drawn from (`[len(token_ids), vocab]`, after the
    request's temperature / top-k / top-p), or None for deterministic drafters (q is one-hot).
    `kind` names the evidence the draft rests on (the n-gram drafter's `copy3`: a copy after a
    3-token suffix match); the cost-aware policy learns acceptance per kind, because kinds differ
    far more than requests do ("": one kind).
    """

    token_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))  # int32 [k]
    probs: torch.Tensor | None = None  # [k, vocab]
    kind: str = ""

    def __post_init__(self) -> None:
        assert self.token_ids.ndim == 1, self.token_ids.shape
        if self.probs is not None:
            assert self.probs.shape[0] == len(self.token_ids), (self.probs.shape, len(self.token_ids))

    def __len__(self) -> int:
        return len(self.token_ids)


EMPTY_DRAFT = Draft()


@runtime_checkable
class Drafter(Protocol):
    """Proposes continuations; never sees logits of the target and never changes the output."""

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Start tracking a request whose context is `prompt_ids`."""

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        """One draft per request, each at most `max_lengths[i]` tokens (0 allowed: plain step)."""

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Tokens that joined the request's context this step (accepted draft + target token)."""

    def end(self, request_id: str) -> None:
        """Forget the request; called exactly once, also for requests that were cancelled."""
