"""How long replies run (`specdraft.policy.lengths`): the expected further tokens of a running row."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.policy.lengths import MIN_REPLIES, ReplyLengths


def kept(*replies: tuple[int, bool]) -> ReplyLengths:
    lengths = ReplyLengths()
    for length, ended in replies:
        lengths.record(length, ended)
    return lengths


def test_without_evidence_a_row_runs_to_its_limit():
    assert kept().served(0, 500) == 500
    assert kept(*[(10, True)] * (MIN_REPLIES - 1)).served(0, 500) == 500  # too few replies kept
    assert kept(*[(10, True)] * 8).served(10, 500) == 500  # none ran this far


def test_replies_that_end_by_themselves_bound_the_tokens_served():
    assert kept(*[(10, True)] * 8).served(0, 500) == 10
    assert kept(*[(10, True)] * 8).served(4, 500) == 6
    assert kept(*[(10, True)] * 8).served(0, 3) == 3  # the room caps it


def test_a_reply_cut_at_its_limit_says_only_that_replies_run_that_long():
    assert kept(*[(128, False)] * 8).served(0, 4000) == 4000
    # Half end at 10 tokens, half are cut at 100: past 10 tokens S is 1/2, and stays so past 100.
    mixed = kept(*[(10, True), (100, False)] * 4)
    assert mixed.served(0, 100) == pytest.approx(10 + 90 * 0.5)
    assert mixed.served(20, 1000) == pytest.approx(1000)  # those that ran past 10 were all cut: no end seen


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=MIN_REPLIES, max_size=40), st.integers(0, 70), st.integers(1, 80))
def test_with_every_reply_ended_it_is_the_mean_over_those_that_ran_this_far(lengths, generated, room):
    """No reply cut: the estimate is the plain mean of min(L - g, room) over the replies longer than g."""
    longer = [n for n in lengths if n > generated]
    expected = sum(min(n - generated, room) for n in longer) / len(longer) if longer else room
    assert kept(*[(n, True) for n in lengths]).served(generated, room) == pytest.approx(expected)
