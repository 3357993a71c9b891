"""Per-request n-gram tables over a growing context: for every order m in 1..max_n, each m-gram of the
context that has a follower maps to its most recent position, its count and its most frequent follower.

The same entries serve prompt lookup (continue from the most recent earlier occurrence of the
longest matching suffix) and the frequency model (most frequent next token after the last 1..max_n-1
tokens). Appending a token costs O(max_n^2) and a query O(max_n) hash probes, whatever the length.

Layout, all int32:
- `tokens` [capacity]: `tokens[:length]` is the context; `tokens[length:]` is scratch where a draft
  is written, so that n-grams running into the draft are contiguous and hash like any other.
- `table` [max_n, slots, FIELDS]: row m - 1 is an open-addressing hash table (linear probing) of
  m-grams, keyed by content. A slot stores no key: LAST points into `tokens`, and the m tokens before
  it are the key. `slots` is a power of two with length <= slots / 2 (an order has at most `length`
  distinct m-grams), so the load stays at or below 1/2.

Invariant at context length L: the table holds exactly the occurrences tokens[e - m : e] with
m <= e <= L - 1, i.e. those followed by a token of the context. Recording an occurrence one token
late keeps the context's own suffix out, so looking the suffix up finds an earlier occurrence.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from specdraft.splitmix import mix_kernel

# Fields of a slot.
LAST = 0  # end (exclusive) of the most recent occurrence; 0 marks an empty slot (ends are >= 1)
COUNT = 1  # occurrences with a follower
BEST = 2  # most frequent follower, ties to the most recent; -1 for order max_n (not tracked)
BEST_COUNT = 3  # how often BEST followed
FIELDS = 4

MIN_SLOTS = 64

_SEED = np.uint64(0x9E3779B97F4A7C15)


def slots_for(length: int) -> int:
    """Table slots that keep the load at or below 1/2 for a context of `length` tokens."""
    slots = MIN_SLOTS
    while slots < 2 * length:
        slots *= 2
    return slots


def new_table(max_n: int, length: int) -> np.ndarray:
    return np.zeros((max_n, slots_for(length), FIELDS), dtype=np.int32)


@njit(cache=True, nogil=True)
def gram_hash(tokens: np.ndarray, start: int, n: int, seed: np.uint64) -> np.uint64:
    """The tokens' hash: every token's bits reach the low bits that pick the slot (`splitmix.mix`)."""
    h = seed
    for j in range(n):
        h = mix_kernel(h ^ np.uint64(tokens[start + j]))
    return h


@njit(cache=True, nogil=True)
def _same(tokens: np.ndarray, a: int, b: int, n: int) -> bool:
    for j in range(n):
        if tokens[a + j] != tokens[b + j]:
            return False
    return True


@njit(cache=True, nogil=True)
def find(tokens: np.ndarray, table: np.ndarray, n: int, start: int) -> int:
    """Slot of the n-gram tokens[start : start + n] in order n's table, or -1 if it has no entry."""
    rows = table[n - 1]
    mask = rows.shape[0] - 1
    i = np.int64(gram_hash(tokens, start, n, _SEED) & np.uint64(mask))
    while True:
        last = rows[i, LAST]
        if last == 0:
            return -1
        if _same(tokens, last - n, start, n):
            return i
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _upsert(tokens: np.ndarray, rows: np.ndarray, m: int, end: int) -> int:
    """Record the occurrence tokens[end - m : end]; return its slot."""
    mask = rows.shape[0] - 1
    i = np.int64(gram_hash(tokens, end - m, m, _SEED) & np.uint64(mask))
    while True:
        last = rows[i, LAST]
        if last == 0:
            rows[i, LAST] = end
            rows[i, COUNT] = 1
            rows[i, BEST] = -1
            rows[i, BEST_COUNT] = 0
            return i
        if _same(tokens, last - m, end - m, m):
            rows[i, LAST] = end
            rows[i, COUNT] += 1
            return i
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def extend(tokens: np.ndarray, table: np.ndarray, length: int, new: np.ndarray) -> int:
    """Append `new` to the context of `length` tokens and index it; return the new length.

    The caller guarantees room: len(tokens) >= length + len(new) and table slots >= 2 * (length + len(new)).
    """
    max_n = table.shape[0]
    for x in new:
        end = length  # the occurrences ending here gain `x` as their follower
        tokens[end] = x
        # Highest order first: order m's follower count is the count of the (m + 1)-gram
        # tokens[end - m : end + 1], whose occurrences ending at `end` must already be recorded.
        for m in range(min(max_n, end), 0, -1):
            rows = table[m - 1]
            i = _upsert(tokens, rows, m, end)
            if m < max_n:
                j = find(tokens, table, m + 1, end - m)
                # +1: the occurrence ending at end + 1 has no follower yet, so it is not in the table.
                pair = (table[m, j, COUNT] if j >= 0 else 0) + 1
                if pair >= rows[i, BEST_COUNT]:
                    rows[i, BEST] = x
                    rows[i, BEST_COUNT] = pair
        length += 1
    return length


@njit(cache=True, nogil=True)
def rehash(tokens: np.ndarray, table: np.ndarray, slots: int) -> np.ndarray:
    """The same entries in a table of `slots` slots (a power of two)."""
    max_n = table.shape[0]
    grown = np.zeros((max_n, slots, FIELDS), dtype=np.int32)
    mask = slots - 1
    for m in range(1, max_n + 1):
        old, new = table[m - 1], grown[m - 1]
        for s in range(old.shape[0]):
            last = old[s, LAST]
            if last == 0:
                continue
            i = np.int64(gram_hash(tokens, last - m, m, _SEED) & np.uint64(mask))
            while new[i, LAST] != 0:
                i = (i + 1) & mask
            new[i, :] = old[s, :]
    return grown


@njit(cache=True, nogil=True)
def longest_match(tokens: np.ndarray, table: np.ndarray, length: int, min_n: int, max_n: int) -> tuple[int, int]:
    """The longest (max_n down to min_n), most recent earlier occurrence of the context's suffix:
    (where its continuation starts, its length n), or (-1, 0) when no suffix of those orders recurs."""
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        i = find(tokens, table, n, length - n)
        if i >= 0:
            return table[n - 1, i, LAST], n
    return -1, 0


def warm_up() -> None:
    """Compile (or load from the cache) every kernel here, with the argument types of real calls."""
    tokens = np.zeros(16, dtype=np.int32)
    table = np.zeros((3, MIN_SLOTS, FIELDS), dtype=np.int32)
    length = extend(tokens, table, 0, np.array([1, 2, 1, 2], dtype=np.int32))
    table = rehash(tokens, table, 2 * MIN_SLOTS)
    longest_match(tokens, table, length, 1, 3)
    find(tokens, table, 2, 0)
