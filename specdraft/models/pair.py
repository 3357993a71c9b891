"""The draft model of a pair: `load_draft` loads the model drafter's model as `plan.plan_draft`
planned it, the default an int8 copy of the target (`find.SELF_DRAFT`), and refuses one whose token
ids do not mean what the target's mean (`check_draft_pair`)."""

from __future__ import annotations

import logging

from specdraft.backend import forward
from specdraft.errors import DraftModelMismatchError
from specdraft.models.find import SELF_DRAFT
from specdraft.models.loaded import LoadedModel, linear_bytes, vocab_size
from specdraft.models.loader import int8_copy, load
from specdraft.models.plan import DraftPlan

log = logging.getLogger("specdraft")

PROBE = "Speculative decoding, déjà vu: 12 tokens → 3 steps. def f(x): return {'a': x}\n"


def load_draft(plan: DraftPlan, target: LoadedModel) -> LoadedModel:
    """The model drafter's model as `plan_draft` planned it (`build_runtime` loads it once for every
    drafter built on `model`); refused unless it shares the target's vocabulary (`check_draft_pair`)."""
    if plan == SELF_DRAFT:
        return _self_draft(target)
    draft = plan if isinstance(plan, LoadedModel) else load(plan)
    check_draft_pair(target, draft)
    return draft


def _self_draft(target: LoadedModel) -> LoadedModel:
    """An int8 copy of the target, with a warning where it cannot be cheaper than the target."""
    if not forward.supports(target.model):
        raise ValueError(f"the {SELF_DRAFT} draft needs a target of a family our forward runs; "
                         f"give a draft model for {target.name!r}")
    draft = int8_copy(target)
    ours, theirs = linear_bytes(draft.model), linear_bytes(target.model)
    if ours >= theirs:  # a native target: its blocks are fewer bytes than any int8 copy
        log.warning("the model drafter's default draft (%s, an int8 copy of the target) reads %.0f MB of weights "
                    "a token against the target's own %.0f MB (%s weights): it cannot be cheaper than the target, "
                    "so the cost-aware policy will rarely call it; give --draft-model a smaller model with the "
                    "target's vocabulary", SELF_DRAFT, ours / 1e6, theirs / 1e6, target.weights)
    return draft


def check_draft_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft model whose token ids do not mean what the target's mean: another vocabulary
    size (after padding), other special tokens, or another tokenization of a probe string."""
    problems = []
    if vocab_size(target) != vocab_size(draft):
        problems.append(f"vocabulary sizes differ ({vocab_size(target)} vs {vocab_size(draft)})")
    for attribute in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        ours, theirs = getattr(target.tokenizer, attribute, None), getattr(draft.tokenizer, attribute, None)
        if ours != theirs:
            problems.append(f"{attribute} differs ({ours} vs {theirs})")
    if set(target.eos_token_ids) != set(draft.eos_token_ids):
        problems.append(f"end-of-sequence ids differ ({sorted(target.eos_token_ids)} vs {sorted(draft.eos_token_ids)})")
    ours, theirs = target.tokenizer.encode(PROBE), draft.tokenizer.encode(PROBE)
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        problems.append(f"the tokenizers split a probe string differently (from token {at} on)")
    if problems:
        raise DraftModelMismatchError(f"draft model {draft.name!r} cannot draft for target {target.name!r}: "
                                      + "; ".join(problems))
