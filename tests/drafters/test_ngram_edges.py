"""The `ngram` drafter's edge cases, each by hand: an empty or unrepeated context, copies and chains
capped by the budget and k, ties and the confidence floor, EOS ending a draft unless ignored, the
adaptive draft length, a batch padded with -1; and its drafts naming their kind (the length of the
match copied after, measured past the tables, or `chain`)."""

from __future__ import annotations

import pytest

from specdraft.drafters.ngram import NgramDrafter
from specdraft.params import SamplingParams


def drafts_for(prompt, limit=5, k=5, eos=(), ignore_eos=False, **options):
    drafter = NgramDrafter(k=k, eos_token_ids=eos, **options)
    drafter.begin("r", prompt, SamplingParams(ignore_eos=ignore_eos))
    return drafter.propose(["r"], [limit])[0].token_ids.tolist()


@pytest.mark.parametrize(
    "prompt, limit, k, options, expected",
    [
        ([], 5, 5, {}, []),  # empty context
        ([7], 5, 5, {}, []),  # one token: nothing before it
        ([1, 2, 3, 4, 5, 6], 5, 5, {}, []),  # no repeated n-gram at all
        ([1, 2, 3, 9, 1, 2], 5, 5, {}, [3, 9, 1, 2, 3]),  # copy, then the chain continues past the end
        ([1, 2, 3, 9, 1, 2], 5, 5, {"min_confidence": 1.0, "max_n": 2}, [3, 9, 1, 2, 3]),
        ([5, 6, 5, 6], 5, 5, {"copy_min_n": 2}, [5, 6, 5, 6, 5]),  # match at the very end (e = L - 1 + 1)
        ([1, 2, 3, 9, 1, 2], 2, 5, {}, [3, 9]),  # the budget caps the draft
        ([1, 2, 3, 9, 1, 2], 0, 5, {}, []),  # a zero budget: a plain step
        ([1, 2, 3, 9, 1, 2], 8, 3, {}, [3, 9, 1]),  # k caps it
        ([1, 2, 3, 1, 2], 5, 5, {"copy_min_n": 9}, [3, 1, 2, 3, 1]),  # chain only: counts, no copy
        ([4, 1, 4, 2, 4, 2, 4], 3, 5, {"copy_min_n": 9, "max_n": 2}, [2, 4, 2]),  # 4 -> 2 twice, -> 1 once
        ([4, 1, 4, 2, 4], 3, 5, {"copy_min_n": 9, "max_n": 2}, [2, 4, 2]),  # tie 1:1 -> the most recent (2)
        ([4, 1, 4, 2, 4], 3, 5, {"copy_min_n": 9, "max_n": 2, "min_confidence": 0.6}, []),  # 1/2 < 0.6: unsure
    ],
)
def test_edge_cases(prompt, limit, k, options, expected):
    assert drafts_for(prompt, limit, k, **options) == expected


def test_copy_stops_at_the_end_of_the_context_when_k_is_larger():
    # Five tokens follow the match; the chain then stops: after 2 came 9 and 8 (share 1/2 < 0.6).
    prompt = [1, 2, 9, 2, 8, 1, 2]
    assert drafts_for(prompt, limit=8, k=8, max_n=2, min_confidence=0.6) == [9, 2, 8, 1, 2]


@pytest.mark.parametrize("ignore_eos, expected", [(False, [3, 0]), (True, [3, 0, 4, 1, 2])])
def test_draft_ends_after_eos_unless_ignored(ignore_eos, expected):
    prompt = [1, 2, 3, 0, 4, 1, 2]
    assert drafts_for(prompt, eos=(0,), ignore_eos=ignore_eos) == expected


def test_eos_from_the_chain_ends_the_draft():
    assert drafts_for([5, 0, 5], eos=(0,), copy_min_n=9) == [0]


def adaptive_lengths(rejected_steps: set[int], steps: int = 6, **options) -> list[int]:
    """Draft lengths along a 20-token cycle when the target rejects the first draft token at the
    given steps and accepts every draft in full otherwise."""
    drafter = NgramDrafter(k=5, **options)
    cycle = list(range(10, 30))
    drafter.begin("r", cycle * 3, SamplingParams())
    lengths = []
    for step in range(steps):
        [draft] = drafter.propose(["r"], [5])
        lengths.append(len(draft))
        truth = draft.token_ids.tolist()
        following = cycle[(cycle.index(truth[-1]) + 1) % 20]
        # A rejection: the target says the token after the draft's first (15 where the draft had 10).
        kept = [cycle[(cycle.index(truth[0]) + 5) % 20]] if step in rejected_steps else truth + [following]
        drafter.accept("r", kept)
    return lengths


@pytest.mark.parametrize(
    "options, expected",
    [
        # Halve after a rejected first token, +2 after a full draft of k_cur tokens.
        ({"adaptive": True, "adapt_from_batch": 1, "strong_copy_n": 9}, [5, 2, 4, 5, 5, 2]),
        # A copy from a 4-token match ignores k_cur: only the step right after the rejection is short.
        ({"adaptive": True, "adapt_from_batch": 1}, [5, 2, 5, 5, 5, 2]),
        # One request per step, below adapt_from_batch: drafts stay at k.
        ({"adaptive": True, "adapt_from_batch": 2, "strong_copy_n": 9}, [5, 5, 5, 5, 5, 5]),
        # Off (the default: the engine's cost-aware policy owns draft lengths): drafts stay at k.
        ({"adapt_from_batch": 1, "strong_copy_n": 9}, [5, 5, 5, 5, 5, 5]),
    ],
)
def test_adaptive_draft_length(options, expected):
    assert adaptive_lengths({0, 4}, **options) == expected


def test_batch_pads_with_minus_one():
    drafter = NgramDrafter(k=4)
    drafter.begin("long", [1, 2, 3, 4, 5, 1, 2], SamplingParams())
    drafter.begin("none", [1, 2, 3], SamplingParams())
    drafts = drafter.propose(["long", "none"], [4, 4])
    assert [d.token_ids.tolist() for d in drafts] == [[3, 4, 5, 1], []]
    assert drafter._out[:2].tolist() == [[3, 4, 5, 1], [-1, -1, -1, -1]]


def test_drafts_name_their_kind():
    """A copy names the length of the suffix match it copies after; a chain of followers is `chain`."""
    copier = NgramDrafter(k=4)
    copier.begin("r", [1, 2, 3, 4, 5, 50, 51, 1, 2, 3, 4, 5, 60, 61, 4, 5], SamplingParams())
    copier.begin("s", [7, 8, 9, 7, 8, 9, 7, 8], SamplingParams())
    copy2, copy4 = copier.propose(["r", "s"], [4, 4])
    assert (copy2.kind, copier.match_length("r")) == ("copy2", 2)
    assert copy4.kind == "copy4" and copy4.token_ids.tolist() == [9, 7, 8, 9]  # [8, 9, 7, 8] seen before
    [alone] = copier.propose(["r"], [4])  # the one-request path names it too
    assert alone.kind == "copy2"
    chainer = NgramDrafter(k=4, copy_min_n=5)  # never copies
    chainer.begin("r", [1, 2, 1, 2, 1], SamplingParams())
    [chain] = chainer.propose(["r"], [4])
    assert len(chain) and chain.kind == "chain"


def test_a_long_match_is_measured_past_the_tables_and_named_by_powers_of_two():
    """The tables find at most max_n tokens of match; the drafter extends it backwards (up to
    LONG_MATCH), so a copy in progress (code being rewritten) is told from a short coincidence."""
    from specdraft.drafters.ngram import LONG_MATCH

    passage = list(range(100, 140))  # 40 distinct tokens
    drafter = NgramDrafter(k=8)
    for n, kind in ((1, "copy1"), (3, "copy3"), (4, "copy4"), (7, "copy4"), (8, "copy8"), (20, "copy16"), (40, "copy32")):
        context = [*passage, 7, *passage[:n]]
        drafter.begin("r", context, SamplingParams())
        [draft] = drafter.propose(["r"], [8])
        assert (draft.kind, drafter.match_length("r")) == (kind, min(n, LONG_MATCH)), n
        assert draft.token_ids.tolist() == context[n : n + 8]  # what followed the earlier occurrence
        drafter.end("r")
