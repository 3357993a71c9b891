"""Prompt lookup by scanning (the first version): propose the k tokens that followed the most recent
earlier occurrence of the context's last n tokens, n from max_n down to min_n.

Its cost grows with context length; it is kept as the reference the indexed `ngram` drafter is
measured against.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from specdraft.drafters.registry import register
from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.drafters.buffers import TokenBuffer
from specdraft.params import SamplingParams


@njit(cache=True, nogil=True)
def scan_lookup(tokens: np.ndarray, length: int, min_n: int, max_n: int, k: int, out: np.ndarray) -> int:
    """Write up to k proposed tokens into `out`; return how many. `tokens[:length]` is the context."""
    if k <= 0:
        return 0
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = length - n
        # Most recent earlier occurrence first; `start + n <= length - 1` leaves a token to copy.
        for start in range(suffix - 1, -1, -1):
            match = True
            for j in range(n):
                if tokens[start + j] != tokens[suffix + j]:
                    match = False
                    break
            if match:
                count = min(k, length - (start + n))
                for j in range(count):
                    out[j] = tokens[start + n + j]
                return count
    return 0


class ScanPromptLookupDrafter:
    """Deterministic drafts copied from the request's own context (prompt + output). It declares no
    parts: its cost grows with the context, so the engine times its calls like any undeclared drafter's."""

    def __init__(self, k: int = 5, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self._contexts: dict[str, TokenBuffer] = {}
        self._out = np.empty(max(k, 1), dtype=np.int32)
        scan_lookup(np.zeros(4, dtype=np.int32), 4, 1, 1, 1, self._out)  # compile before any request

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self._contexts[request_id] = TokenBuffer(prompt_ids)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = []
        for request_id, limit in zip(request_ids, max_lengths):
            context = self._contexts[request_id]
            count = scan_lookup(context.data, context.length, self.min_n, self.max_n, min(self.k, limit), self._out)
            drafts.append(Draft(self._out[:count].copy()) if count else EMPTY_DRAFT)
        return drafts

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self._contexts[request_id].extend(token_ids)

    def end(self, request_id: str) -> None:
        self._contexts.pop(request_id, None)


@register("prompt-lookup-scan")
def _create(k: int, min_n: int = 1, max_n: int = 3) -> ScanPromptLookupDrafter:
    """`min_n`..`max_n`: the suffix lengths matched, longest first."""
    return ScanPromptLookupDrafter(k=k, min_n=min_n, max_n=max_n)
