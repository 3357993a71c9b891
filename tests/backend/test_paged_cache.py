"""The paged KV cache (`specdraft.backend.paged`): any run of the owner's moves leaves every row's entries
as the one-block cache (`RowKVCache`) leaves them; a row holds its own length's pages, not the longest
row's; a long row's pages go back when it ends; torch's attention reads it gathered through `update`."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.backend.cache import SPAN, RowKVCache
from specdraft.backend.paged import BLANK, PagedKVCache

LAYERS, HEADS, DIM = 2, 2, 4


def both() -> tuple[RowKVCache, PagedKVCache]:
    cpu = torch.device("cpu")
    return RowKVCache(LAYERS, HEADS, DIM, torch.float32, cpu), PagedKVCache(LAYERS, HEADS, DIM, torch.float32, cpu)


def entries(n: int, seed: int) -> torch.Tensor:
    return torch.randn((2, LAYERS, HEADS, n, DIM), generator=torch.Generator().manual_seed(seed))


def a_pass(cache, window: slice, steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A pass as torch's attention runs one over the window's rows (`update`): what it reads, per layer."""
    lengths = torch.tensor(cache.lengths[window])
    positions = lengths[:, None] + torch.arange(steps)[None, :]  # [batch, T]
    cache.prepare(window, positions, int(lengths.max()) + steps)
    new = torch.randn((2, LAYERS, len(lengths), HEADS, steps, DIM), generator=torch.Generator().manual_seed(seed))
    return [cache.update(new[0, layer], new[1, layer], layer) for layer in range(LAYERS)]


MOVES = st.lists(st.tuples(st.sampled_from(["push", "write", "pass", "truncate", "move", "swap", "pop"]),
                           st.integers(0, 7), st.integers(1, 300)), max_size=25)


@settings(max_examples=40, deadline=None)
@given(moves=MOVES)
def test_any_run_of_moves_leaves_the_rows_as_the_one_block_cache_does(moves):
    """What a pass reads within each row's length, and every row's committed entries, equal the
    one-block cache's after pushes, writes, passes (committed in part), roll-backs, moves, swaps, pops."""
    caches = both()
    for i, (move, a, n) in enumerate(moves):
        rows = caches[0].rows
        if move == "push" or rows == 0:
            for cache in caches:
                cache.push_row()
        elif move == "write":
            slot = a % rows
            start = caches[0].lengths[slot] // 2
            for cache in caches:
                cache.write(slot, start, entries(n, i))
        elif move == "pass":
            window = slice(0, a % rows + 1)
            steps = n % 9 + 1
            read = [a_pass(cache, window, steps, i) for cache in caches]
            for b, length in enumerate(caches[0].lengths[window]):
                for (ours, theirs) in zip(read[1], read[0]):
                    for x, y in zip(ours, theirs):
                        assert torch.equal(x[b, :, : length + steps], y[b, :, : length + steps])
            for cache in caches:
                for slot in range(window.stop):
                    cache.commit(slot, (n + slot) % (steps + 1))
        elif move == "truncate":
            slot = a % rows
            length = caches[0].lengths[slot] * (n % 4) // 4
            for cache in caches:
                cache.truncate(slot, length)
        elif move in ("move", "swap"):
            src, dst = a % rows, n % rows
            for cache in caches:
                cache.swap_rows(src, dst) if move == "swap" else cache.move_row(src, dst)
        else:
            for cache in caches:
                cache.pop_row()
        assert caches[1].lengths == caches[0].lengths
        for slot, length in enumerate(caches[0].lengths):
            assert torch.equal(caches[1].read(slot, 0, length), caches[0].read(slot, 0, length)), (i, move, slot)


def test_a_long_row_beside_short_ones_costs_its_own_pages_and_gives_them_back():
    """One 8k-position row beside 15 rows of 100: the one-block cache holds 16 x 8k positions, the paged
    one the rows' own pages (and at most as many again, free); when the long row ends the pool shrinks."""
    flat, paged = both()
    for cache in (flat, paged):
        for slot in range(16):
            cache.push_row()
            cache.write(slot, 0, entries(8192 if slot == 0 else 100, slot))
    used = 8192 // SPAN + 15
    assert paged.used_pages == used
    assert paged.pages <= 2 * (used + 1)
    assert flat.slots * flat.capacity >= 16 * 8192
    flat.move_row(15, 0)
    paged.move_row(15, 0)
    for cache in (flat, paged):
        cache.pop_row()
    assert paged.used_pages == 15 and paged.pages <= 4 * 16
    for slot in range(15):
        assert torch.equal(paged.read(slot, 0, 100), flat.read(slot, 0, 100))


def test_a_row_rolled_back_gives_the_pages_past_its_length_back():
    _, paged = both()
    paged.push_row()
    paged.write(0, 0, entries(5 * SPAN, 0))
    assert paged.used_pages == 5
    paged.truncate(0, 2 * SPAN + 1)  # three pages hold its first 2 SPAN + 1 positions
    assert paged.used_pages == 3 and paged.lengths[0] == 2 * SPAN + 1
    assert torch.equal(paged.read(0, 0, 2 * SPAN + 1), entries(5 * SPAN, 0)[..., : 2 * SPAN + 1, :])
    paged.write(0, 2 * SPAN + 1, entries(SPAN, 1))  # grows again from the pool
    assert paged.used_pages == 4


def test_a_pass_points_spans_past_a_rows_pages_at_the_blank_page():
    """A short row in a pass beside a long one: its table's later spans are the blank page (zeros, never
    written), which the gathered read gives past its own pages."""
    _, paged = both()
    for slot, n in enumerate((3 * SPAN, 5)):
        paged.push_row()
        paged.write(slot, 0, entries(n, slot))
    read = a_pass(paged, slice(0, 2), 1, 7)
    assert paged.table.shape == (2, 4)
    assert (paged.table[1, 1:] == BLANK).all() and (paged.table[0] != BLANK).all()
    keys, _ = read[0]
    assert keys.shape == (2, HEADS, 3 * SPAN + 1, DIM)
    assert torch.count_nonzero(keys[1, :, SPAN:]) == 0
