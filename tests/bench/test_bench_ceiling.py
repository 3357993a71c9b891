"""The oracle copy drafter that bounds what copying can reach (benchmarks/serving/ceiling.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.serving.ceiling import UNBOUNDED, copy_ceiling


def naive_ceiling(prompt: list[int], output: list[int], k: int, corpus: list[list[int]]) -> float:
    """The same oracle written plainly: every step, the longest agreeing continuation after any
    earlier occurrence of the last token, in the known context or in a corpus sequence."""
    tokens = prompt + output
    steps, pos = 1, len(prompt) + 1
    while pos < len(tokens):
        limit = min(k, len(tokens) - pos)
        best = 0
        for source, end in [(tokens, pos)] + [(seq, len(seq)) for seq in corpus]:
            for j in range(end - 1):
                if source[j] != tokens[pos - 1]:
                    continue
                n = 0
                while n < limit and j + 1 + n < end and source[j + 1 + n] == tokens[pos + n]:
                    n += 1
                best = max(best, n)
        pos += best + 1
        steps += 1
    return len(output) / steps


@pytest.mark.parametrize("prompt, output, k, corpus, expected", [
    ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], UNBOUNDED, [], 8 / 2),  # one copy after the first token
    ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], 2, [], 8 / 4),  # drafts of 2: 1 + 3 + 3 + 1
    ([9], [1, 2, 3, 4], UNBOUNDED, [], 1.0),  # nothing to copy: a token a step
    ([9], [1, 2, 3, 4], UNBOUNDED, [[5, 1, 2, 3, 4]], 2.0),  # an earlier output holds the rest
    ([1, 2, 3], [], UNBOUNDED, [], 0.0),
    ([7, 7], [7, 7, 7, 7], UNBOUNDED, [], 4 / 2),  # copies up to the end of the known context: 1 + 3
])
def test_oracle_steps(prompt, output, k, corpus, expected):
    assert copy_ceiling(prompt, output, k, corpus) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=20),
       output=st.lists(st.integers(0, 3), min_size=1, max_size=20),
       k=st.sampled_from([1, 2, 5, UNBOUNDED]),
       corpus=st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=3))
def test_oracle_matches_a_plain_reference(prompt, output, k, corpus):
    assert copy_ceiling(prompt, output, k, corpus) == pytest.approx(naive_ceiling(prompt, output, k, corpus))


def test_longer_drafts_and_more_sources_never_lower_the_ceiling():
    prompt, output = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [1, 4, 1, 5, 9, 2, 6, 0, 3, 1, 4, 1, 5]
    by_k = [copy_ceiling(prompt, output, k) for k in (1, 2, 5, UNBOUNDED)]
    assert by_k == sorted(by_k) and by_k[-1] > by_k[0]
    assert copy_ceiling(prompt, output, corpus=[[0, 3, 1, 4]]) >= by_k[-1]
