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

In the engine the two halves are asked apart (`propose_free`, then `propose_costly`), so the
cost-aware policy sees the free drafts before it decides whether the model's drafts pay this step,
and learns their acceptance separately (sources `hybrid` and `hybrid/model`). Default `min_match`
0: when the model does not pay (an int8 self-draft on CPU), the hybrid drafts exactly like `ngram`;
with a strong draft model (Llama-3.2-1B for 3B on a GPU) `min_match=3` hands short matches to it.
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
    costly_part = "model"  # the policy's source name for those: "hybrid/model"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int = 0) -> None:
        if min_match < 0:
            raise ValueError(f"min_match must be >= 0, got {min_match}")
        self.ngram, self.model, self.min_match = ngram, model, min_match
        self.ngram_drafts = 0  # drafts taken from each part, for reports
        self.model_drafts = 0

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.ngram.begin(request_id, prompt_ids, params)
        self.model.begin(request_id, prompt_ids, params)

    def propose_free(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft | None]:
        """The n-gram part's confident drafts (no forward pass); None where the model would draft."""
        drafts = self.ngram.propose(request_ids, max_lengths)
        out: list[Draft | None] = [
            d if len(d) and self.ngram.match_length(r) >= self.min_match else None for r, d in zip(request_ids, drafts)]
        self.ngram_drafts += sum(d is not None for d in out)
        return out

    def propose_costly(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        """The model part's drafts, for rows without a confident free draft."""
        drafts = self.model.propose(request_ids, max_lengths)
        self.model_drafts += sum(len(d) > 0 for d in drafts)
        return drafts

    @property
    def last_pass_seconds(self) -> float | None:
        """The model part's last drafting pass, without catching up (see `ModelDrafter`)."""
        return self.model.last_pass_seconds

    @property
    def last_catch_up(self) -> tuple[int, float]:
        return self.model.last_catch_up

    def backlog(self, request_id: str) -> int:
        """What the model part must catch up on before it drafts this row (see `ModelDrafter`)."""
        return self.model.backlog(request_id)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        """Both parts in one call (for callers without a cost-aware policy)."""
        drafts = self.propose_free(request_ids, max_lengths)
        rest = [b for b, d in enumerate(drafts) if d is None and max_lengths[b] > 0]
        if rest:
            for b, draft in zip(rest, self.propose_costly([request_ids[b] for b in rest], [max_lengths[b] for b in rest])):
                drafts[b] = draft
        return [EMPTY_DRAFT if d is None else d for d in drafts]

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.ngram.accept(request_id, token_ids)
        self.model.accept(request_id, token_ids)

    def end(self, request_id: str) -> None:
        self.ngram.end(request_id)
        self.model.end(request_id)


@register("hybrid")
def _create(k: int, target: Any, draft_model: str | LoadedModel | None = None, min_match: int = 0,
            dtype: str = "auto", static_shapes: StaticShapes | None = None) -> HybridDrafter:
    """`draft_model`, `dtype`, `static_shapes`: as for the `model` drafter; `min_match`: the shortest
    suffix match whose copy the n-gram drafter drafts instead of the model (0: any n-gram draft)."""
    draft = load_draft_model(draft_model, target, dtype)
    model = ModelDrafter(draft.model, k=k, eos_token_ids=target.eos_token_ids, dtype=draft.compute_dtype,
                         static=static_shapes)
    return HybridDrafter(NgramDrafter(k=k, eos_token_ids=target.eos_token_ids), model, min_match=min_match)
