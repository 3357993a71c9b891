"""The `hybrid` drafter: the `ngram` drafter where it has a confident match, the `model` drafter
everywhere else.

Policy, per request and step: first ask the n-gram drafter (microseconds). If its draft copies the
continuation of an earlier occurrence of a context suffix at least `min_match` tokens long (a copy
in progress: code being edited, a schema's keys repeating, a passage quoted), the request drafts
that; otherwise the model drafts for it. Copies of long matches are accepted far more often than a
small model's guesses and cost no forward pass, while the model covers the text that has no earlier
occurrence. Both drafters see every token that joins the context (`accept`), so either can take
over at any step; the model drafter catches up lazily on what it sat out (`drafters.model`).
Drafts keep their kind: n-gram drafts are deterministic, model drafts carry q.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdraft.drafters import register
from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.backend import StaticShapes
from specdraft.drafters.model import ModelDrafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.models import LoadedModel, load_draft_model
from specdraft.params import SamplingParams


class HybridDrafter:
    cheap = False  # some of its drafts cost forward passes: the engine decides the length first

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int = 3) -> None:
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {min_match}")
        self.ngram, self.model, self.min_match = ngram, model, min_match
        self.ngram_drafts = 0  # drafts taken from each part, for reports
        self.model_drafts = 0

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.ngram.begin(request_id, prompt_ids, params)
        self.model.begin(request_id, prompt_ids, params)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = self.ngram.propose(request_ids, max_lengths)
        confident = [len(d) > 0 and self.ngram.match_length(r) >= self.min_match for r, d in zip(request_ids, drafts)]
        rest = [b for b, (ok, n) in enumerate(zip(confident, max_lengths)) if not ok and n > 0]
        self.ngram_drafts += sum(confident)
        if rest:
            for b, draft in zip(rest, self.model.propose([request_ids[b] for b in rest], [max_lengths[b] for b in rest])):
                drafts[b] = draft
                self.model_drafts += len(draft) > 0
        return [d if ok or b in rest else EMPTY_DRAFT for b, (d, ok) in enumerate(zip(drafts, confident))]

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.ngram.accept(request_id, token_ids)
        self.model.accept(request_id, token_ids)

    def end(self, request_id: str) -> None:
        self.ngram.end(request_id)
        self.model.end(request_id)


@register("hybrid")
def _create(k: int, target: Any, draft_model: str | LoadedModel | None = None, min_match: int = 3,
            dtype: str = "auto", static_shapes: StaticShapes | None = None) -> HybridDrafter:
    """`draft_model`, `dtype`, `static_shapes`: as for the `model` drafter; `min_match`: the shortest
    suffix match whose copy the n-gram drafter drafts instead of the model."""
    draft = load_draft_model(draft_model, target, dtype)
    model = ModelDrafter(draft.model, k=k, eos_token_ids=target.eos_token_ids, dtype=draft.compute_dtype,
                         static=static_shapes)
    return HybridDrafter(NgramDrafter(k=k, eos_token_ids=target.eos_token_ids), model, min_match=min_match)
