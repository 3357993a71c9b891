"""The `ngram` drafter's index (`specdraft.drafters.ngram_table`) against naive references, on random
token streams appended chunk by chunk: the longest match of a suffix (and the scanning prompt lookup's
copy, the same), the n-gram follower counts, and tables grown through many doublings."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.drafters.ngram_table import BEST, BEST_COUNT, COUNT, extend, find, longest_match, new_table, rehash
from specdraft.drafters.ngram_table import slots_for
from specdraft.drafters.prompt_lookup import scan_lookup
from tests.helpers.ngram_reference import EXAMPLES, ref_follower, ref_longest_match, vocab_sizes


@st.composite
def streams(draw, max_prompt=60, max_chunks=30):
    """A prompt and the chunks appended after it, over a small vocabulary so that n-grams repeat."""
    vocab = draw(vocab_sizes)
    token = st.integers(0, vocab - 1)
    prompt = draw(st.lists(token, max_size=max_prompt))
    chunks = draw(st.lists(st.lists(token, min_size=1, max_size=6), max_size=max_chunks))
    return vocab, prompt, chunks


def index_of(tokens: list[int], capacity_extra: int = 8):
    """The tables of `tokens`, built by appending chunk by chunk with growth, as the drafter does."""
    buffer = np.zeros(len(tokens) + capacity_extra, dtype=np.int32)
    table = new_table(3, 0)
    length = 0
    for start in range(0, len(tokens), 5):
        chunk = np.asarray(tokens[start : start + 5], dtype=np.int32)
        if 2 * (length + len(chunk)) > table.shape[1]:
            table = rehash(buffer, table, slots_for(length + len(chunk)))
        length = extend(buffer, table, length, chunk)
    return buffer, table, length


@settings(max_examples=EXAMPLES, deadline=None)
@given(streams(), st.integers(1, 3), st.integers(1, 3), st.integers(1, 8))
def test_continuation_matches_naive_and_scan(stream, min_n, max_n, k):
    _, prompt, chunks = stream
    ctx = list(prompt)
    buffer = np.zeros(len(prompt) + 6 * len(chunks) + 8, dtype=np.int32)
    table = new_table(3, len(buffer))
    length = extend(buffer, table, 0, np.asarray(prompt, dtype=np.int32))
    scan_out = np.zeros(k, dtype=np.int32)
    for chunk in [[]] + chunks:
        length = extend(buffer, table, length, np.asarray(chunk, dtype=np.int32))
        ctx += chunk
        match = longest_match(buffer, table, length, min(min_n, max_n), max_n)
        assert match == ref_longest_match(ctx, min(min_n, max_n), max_n)
        # The first, scanning prompt lookup proposes exactly the indexed copy.
        count = scan_lookup(buffer, length, 1, 3, k, scan_out)
        start, _ = longest_match(buffer, table, length, 1, 3)
        expected = list(buffer[start : min(start + k, length)]) if start >= 0 else []
        assert list(scan_out[:count]) == expected


@settings(max_examples=EXAMPLES, deadline=None)
@given(streams(max_prompt=120, max_chunks=10), st.data())
def test_follower_counts_match_naive(stream, data):
    vocab, prompt, chunks = stream
    tokens = prompt + [t for chunk in chunks for t in chunk]
    buffer, table, length = index_of(tokens)
    contexts = {tuple(tokens[s : s + n]) for n in (1, 2) for s in range(len(tokens) - n + 1)}
    contexts |= {tuple(data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2))) for _ in range(3)}
    for context in contexts:
        n = len(context)
        buffer[length : length + n] = context  # queries read the scratch past the context
        i = find(buffer, table, n, length)
        got = None if i < 0 else tuple(int(v) for v in table[n - 1, i, [BEST, BEST_COUNT, COUNT]])
        assert got == ref_follower(tokens, list(context)), context


def test_tables_grow_through_many_doublings():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=3000).tolist()
    buffer = np.zeros(len(tokens) + 8, dtype=np.int32)
    table, length, checked = new_table(3, 0), 0, 0
    for start in range(0, len(tokens), 7):
        chunk = np.asarray(tokens[start : start + 7], dtype=np.int32)
        if 2 * (length + len(chunk)) > table.shape[1]:
            table = rehash(buffer, table, slots_for(length + len(chunk)))
            assert longest_match(buffer, table, length, 1, 3) == ref_longest_match(tokens[:length], 1, 3)
            checked += 1
        length = extend(buffer, table, length, chunk)
    assert checked >= 6 and table.shape[1] >= 2 * length
