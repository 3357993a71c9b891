"""`Draft`: what a drafter proposes for one request and the verifier checks, a value both sides
share (so the verifier needs nothing of the drafters package)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # a light module: listing drafters must not import torch
    import torch


@dataclass(frozen=True)
class Draft:
    """Up to k proposed tokens for one request: a chain, each token following the one before.

    `probs` is q, the distribution each token was drawn from (`[len(token_ids), vocab]`, after the
    request's temperature / top-k / top-p), or None for deterministic drafters (q is one-hot).
    `kind` names the evidence the draft rests on (the n-gram drafter's `copy3`: a copy after a
    3-token suffix match); the cost-aware policy learns acceptance per kind, because kinds differ
    far more than requests do ("": one kind). A frozen value, so that fields can be added (token
    trees) without changing what existing drafters return.
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

    def prefix(self, n: int) -> Draft:
        """The first n tokens (a step verifies a prefix of a longer draft)."""
        if n >= len(self):
            return self
        if n <= 0:
            return EMPTY_DRAFT
        return Draft(self.token_ids[:n], None if self.probs is None else self.probs[:n], self.kind)

    def problem(self, vocab_size: int) -> str | None:
        """Why a target with this vocabulary cannot check the draft (None: it can)."""
        if not len(self):
            return None
        low, high = int(self.token_ids.min()), int(self.token_ids.max())
        if low < 0 or high >= vocab_size:
            return f"draft token id {low if low < 0 else high} is outside the vocabulary (0..{vocab_size - 1})"
        if self.probs is not None and tuple(self.probs.shape) != (len(self), vocab_size):
            return f"draft probabilities have shape {tuple(self.probs.shape)}, expected ({len(self)}, {vocab_size})"
        return None


EMPTY_DRAFT = Draft()
