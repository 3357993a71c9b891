"""Arrays that grow by doubling, so that appending is amortised O(1) per element."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def grown(array: np.ndarray, needed: int, keep: int | None = None) -> np.ndarray:
    """`array` where it has `needed` rows; else a new array of twice that many rows (and the same
    trailing shape), its first `keep` rows (default: all) copied from `array`, the rest uninitialised."""
    if needed <= len(array):
        return array
    out = np.empty((2 * needed, *array.shape[1:]), dtype=array.dtype)
    keep = len(array) if keep is None else keep
    out[:keep] = array[:keep]
    return out


class TokenBuffer:
    """An int32 token array that grows by doubling: `data[:length]` are the tokens."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.length = len(tokens)
        self.data = grown(np.empty(0, dtype=np.int32), max(16, self.length))
        self.data[: self.length] = np.asarray(tokens, dtype=np.int32)

    def extend(self, tokens: Sequence[int]) -> None:
        end = self.length + len(tokens)
        self.data = grown(self.data, end, keep=self.length)
        self.data[self.length : end] = np.asarray(tokens, dtype=np.int32)
        self.length = end
