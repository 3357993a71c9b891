"""The `hybrid` drafter: the `ngram` drafter where it has a confident draft, the `model` drafter
everywhere else.

Policy, per request and step: first ask the n-gram drafter (microseconds). Its draft is confident
when it has one (the n-gram drafter only drafts a copy of an earlier occurrence of a context suffix,
or a chain of followers it has seen at least half the time) and, with `min_match` > 0, when it copies
from a match of at least `min_match` tokens. A confident draft is taken as it is: copies (code being
edited, a schema's keys repeating, a passage quoted) are accepted far more often than a small
model's guesses and cost no forward pass. Elsewhere the model drafts. Both drafters see every token
that joins the context (`accept`), so either can take over at any step; the model drafter catches
up lazily on what it sat out (`drafters.model`). Drafts keep their kind: n-gram drafts are
deterministic, model drafts carry q.

It is composed from declared parts (`specdraft.drafters.base.Parts`): a free part, the n-gram
drafter's confident drafts, and a costly part, the model drafter. The engine asks the free part
first and the model only for the rows left without a draft, once the cost-aware policy has seen the
free drafts and decided whether the model's drafts pay this step; the policy learns their acceptance
apart (sources `hybrid` and `hybrid/model`). Default `min_match` 0: when the model does not pay (an
int8 self-draft on CPU), the hybrid drafts exactly like `ngram`; with a strong draft model
(Llama-3.2-1B for 3B on a GPU) `min_match=3` hands short matches to it. Its parts are declared to
the registry (`Part`), which builds them as the `ngram` and `model` drafters with those drafters'
options: cross-request memory and the draft model reach them as they reach `ngram` and `model`.
"""

from __future__ import annotations

from typing import Sequence

from specdraft.drafters.base import EMPTY_DRAFT, Cost, Draft, Parts
from specdraft.drafters.model import ModelDrafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.drafters.registry import Part, register
from specdraft.params import SamplingParams


class ConfidentCopies:
    """The hybrid's free part: the n-gram drafter's drafts where it has one from a match of at least
    `min_match` tokens, empty elsewhere (where the model drafts)."""

    def __init__(self, ngram: NgramDrafter, min_match: int) -> None:
        self.ngram, self.min_match = ngram, min_match

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = self.ngram.propose(request_ids, max_lengths)
        return [d if self.ngram.match_length(r) >= self.min_match else EMPTY_DRAFT for r, d in zip(request_ids, drafts)]


class HybridDrafter:
    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int = 0) -> None:
        if min_match < 0:
            raise ValueError(f"min_match must be >= 0, got {min_match}")
        self.ngram, self.model = ngram, model
        self.parts = Parts(ConfidentCopies(ngram, min_match), free_cost=Cost.FREE, costly=model, costly_name="model",
                           target_cache=model.target_copy)

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.ngram.begin(request_id, prompt_ids, params)
        self.model.begin(request_id, prompt_ids, params)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        """Both parts in one call (for callers without a cost-aware policy)."""
        drafts = self.parts.free.propose(request_ids, max_lengths)
        rest = [b for b, d in enumerate(drafts) if not len(d) and max_lengths[b] > 0]
        if rest:
            costly = self.model.propose([request_ids[b] for b in rest], [max_lengths[b] for b in rest])
            for b, draft in zip(rest, costly):
                drafts[b] = draft
        return drafts

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.ngram.accept(request_id, token_ids)
        self.model.accept(request_id, token_ids)

    def end(self, request_id: str) -> None:
        self.ngram.end(request_id)
        self.model.end(request_id)


@register("hybrid")
def _create(ngram: NgramDrafter = Part("ngram"), model: ModelDrafter = Part("model"), min_match: int = 0) -> HybridDrafter:
    """`ngram`, `model`: its parts, built as those drafters (options under their names are theirs);
    `min_match`: the shortest suffix match whose copy the n-gram part drafts instead of the model (0:
    any n-gram draft)."""
    return HybridDrafter(ngram, model, min_match=min_match)
