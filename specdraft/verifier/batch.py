"""A verify pass's rows as one value (`Batch`) and what the pass decided for them (`Verdict`), both in
the verifier's row order and one layout:

    row r feeds its last token then its draft: flat positions offsets[r] .. offsets[r + 1] - 1

The pass's tokens [N], its logits [N, vocab], the acceptance rule's draws and the emitted tokens all
share that layout, so nothing is padded, unpacked and padded again on the way: row r emits
`tokens[offsets[r] : offsets[r] + accepted[r] + 1]` of the verdict (the position that decided each
token is the one it sits at)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import torch

from specdraft.draft import Draft
from specdraft.results import TokenLogprob

PAD = -1  # in `following`: the last position of a row tests no draft token


def offsets_of(feeds: np.ndarray) -> np.ndarray:
    """Where each row's tokens begin in a flat pass of `feeds` [rows] tokens a row, and where they end:
    int64 [rows + 1]."""
    return np.concatenate([[0], np.cumsum(feeds, dtype=np.int64)])


@dataclass(frozen=True, eq=False)
class Batch:
    """The rows one verify pass checks, in the verifier's order: ids [rows]; tokens int64 [N], row r's
    last token then its counts[r] draft tokens; probs: each row's draft distribution q [counts[r],
    vocab] (None: a deterministic draft)."""

    ids: tuple[str, ...]
    tokens: np.ndarray
    counts: np.ndarray
    probs: tuple[torch.Tensor | None, ...]

    @classmethod
    def of(cls, ids: Sequence[str], last_tokens: Sequence[int], drafts: Sequence[Draft | None]) -> Batch:
        """Rows `ids` with their last tokens and drafts (None or empty: the row takes one token)."""
        if not len(ids) == len(last_tokens) == len(drafts):
            raise ValueError(f"a batch needs a last token and a draft (or None) a row: {len(ids)} rows, "
                             f"{len(last_tokens)} last tokens, {len(drafts)} drafts")
        counts = np.array([0 if d is None else len(d) for d in drafts], dtype=np.int64)
        parts = [np.array([t], dtype=np.int64) if d is None or not len(d)
                 else np.concatenate([[t], d.token_ids]).astype(np.int64) for t, d in zip(last_tokens, drafts)]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return cls(tuple(ids), tokens, counts, tuple(None if d is None else d.probs for d in drafts))

    def __len__(self) -> int:
        return len(self.ids)

    @cached_property
    def feeds(self) -> np.ndarray:
        """Tokens each row feeds the pass: int64 [rows]."""
        return self.counts + 1

    @cached_property
    def offsets(self) -> np.ndarray:
        """int64 [rows + 1] (`offsets_of`)."""
        return offsets_of(self.feeds)

    @cached_property
    def row_of(self) -> np.ndarray:
        """The row of each flat position: int64 [N]."""
        return np.repeat(np.arange(len(self.ids), dtype=np.int64), self.feeds)

    @cached_property
    def following(self) -> np.ndarray:
        """The draft token each position's logits test: the next token of its row, PAD at a row's last
        position (it decides the bonus token). int64 [N]."""
        following = np.empty_like(self.tokens)
        following[:-1] = self.tokens[1:]
        following[self.offsets[1:] - 1] = PAD
        return following

    def draft(self, r: int) -> np.ndarray:
        """Row r's draft tokens."""
        return self.tokens[self.offsets[r] + 1 : self.offsets[r + 1]]


@dataclass(frozen=True, eq=False)
class Verdict:
    """What a pass decided, in its batch's order and layout: row r emitted tokens[offsets[r] :
    offsets[r] + accepted[r] + 1] (its accepted draft, then the recovered or bonus token) unless
    errors[r] says why its grammar failed (it then emitted nothing and must end); grammar_seconds:
    each row's time on its grammar (masks and advancing it); logprobs: each emitted token's entry
    where the row asked (None: it did not); steady: the pass ran at its shape's steady cost
    (`RowModel.forward_pass`: not a static shape's warm-up or capture)."""

    tokens: np.ndarray
    accepted: np.ndarray
    offsets: np.ndarray
    errors: tuple[str | None, ...]
    grammar_seconds: np.ndarray
    logprobs: tuple[tuple[TokenLogprob, ...] | None, ...]
    steady: bool = True

    @classmethod
    def failed(cls, errors: Sequence[str | None], grammar_seconds: Sequence[float]) -> Verdict:
        """A verdict with no pass: every row's grammar failed before it."""
        rows = len(errors)
        return cls(np.zeros(0, dtype=np.int64), np.zeros(rows, dtype=np.int64), np.zeros(rows + 1, dtype=np.int64),
                   tuple(errors), np.asarray(grammar_seconds, dtype=np.float64), (None,) * rows)

    def __len__(self) -> int:
        return len(self.errors)

    def emitted(self, r: int) -> list[int]:
        """Row r's tokens (none where its grammar failed)."""
        if self.errors[r] is not None:
            return []
        start = int(self.offsets[r])
        return self.tokens[start : start + int(self.accepted[r]) + 1].tolist()
