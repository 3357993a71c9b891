"""copycat: a specdraft drafter that proposes what followed the previous occurrence of the last token."""

from typing import Sequence

import numpy as np
from specdraft.drafters.base import Draft
from specdraft.params import SamplingParams


class Copycat:
    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}  # request id -> its context
        self.seen: dict[str, dict[int, int]] = {}  # request id -> token -> its latest position before the end

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.tokens[request_id], self.seen[request_id] = [], {}
        self.accept(request_id, prompt_ids)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = []
        for request_id, limit in zip(request_ids, max_lengths):
            tokens = self.tokens[request_id]
            start = self.seen[request_id].get(tokens[-1], len(tokens) - 1) + 1  # never seen: nothing to copy
            drafts.append(Draft(np.array(tokens[start : start + limit], dtype=np.int32)))
        return drafts

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        tokens, seen = self.tokens[request_id], self.seen[request_id]
        for token in token_ids:
            if tokens:
                seen[tokens[-1]] = len(tokens) - 1
            tokens.append(int(token))

    def end(self, request_id: str) -> None:
        del self.tokens[request_id], self.seen[request_id]


def create(k: int) -> Copycat:  # the factory the entry point names; k: the longest draft it is asked for
    return Copycat()
