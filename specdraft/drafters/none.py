"""The `none` drafter: proposes nothing, so every step is a plain one-token decode (the baseline)."""

from __future__ import annotations

from typing import Sequence

from specdraft.drafters.registry import register
from specdraft.drafters.base import EMPTY_DRAFT, Cost, Draft, Parts
from specdraft.params import SamplingParams


class NoDrafter:
    @property
    def parts(self) -> Parts:
        # Its (empty) drafts cost nothing; it is plain decoding, constrained or not: no forced tokens.
        return Parts(self, free_cost=Cost.FREE, forced_tokens=False)

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        pass

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        return [EMPTY_DRAFT for _ in request_ids]

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        pass

    def end(self, request_id: str) -> None:
        pass


@register("none")
def _create() -> NoDrafter:
    return NoDrafter()
