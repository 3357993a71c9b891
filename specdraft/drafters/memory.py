"""Cross-request n-gram memory: one bounded table shared by all requests that learns from finished
outputs, so a request can draft what earlier requests produced. It is off unless a server turns it
on; without it no request's tokens can reach another request's draft.

It stores hashes and counts only, in an open-addressing table (linear probing, load <= 1/2) keyed by
a 62-bit hash of (kind, order, tokens); two n-grams share an entry only on a hash collision. Kinds:
- context (c = 1..max_n - 1 tokens): COUNT = times c was followed by an output token, BEST = its most
  frequent follower (ties to the most recent), BEST_COUNT = how often;
- pair (c plus one follower): COUNT = times that follower came after c.

Bounded: at most `capacity` entries. Before learning a token that could pass the cap, the memory
decays: every count is halved (rounding down) and entries left at 0 are dropped, repeated until at
most half the cap is used, so rare n-grams go first and old counts fade.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
from numba import njit

from specdraft.drafters.ngram_table import gram_hash
from specdraft.splitmix import mix_kernel

COUNT = 0
BEST = 1
BEST_COUNT = 2
FIELDS = 3
ENTRIES = 0  # index into `stats`

CONTEXT_KIND = 0
PAIR_KIND = 1
FORMAT_VERSION = 1

_SEED = np.uint64(0xD6E8FEB86659FD93)


@njit(cache=True, nogil=True)
def gram_key(tokens: np.ndarray, start: int, n: int, kind: int) -> np.int64:
    """Nonzero 62-bit key of (kind, n, tokens[start : start + n]); 0 marks an empty slot."""
    h = gram_hash(tokens, start, n, mix_kernel(_SEED ^ np.uint64(2 * n + kind)))
    return np.int64(h >> np.uint64(2)) + 1


@njit(cache=True, nogil=True)
def find_key(keys: np.ndarray, key: np.int64) -> int:
    """Slot holding `key`, or -1 (also for the empty memory of a drafter without one)."""
    if keys.shape[0] == 0:
        return -1
    mask = keys.shape[0] - 1
    i = key & mask
    while keys[i] != 0:
        if keys[i] == key:
            return i
        i = (i + 1) & mask
    return -1


@njit(cache=True, nogil=True)
def _slot_for(keys: np.ndarray, key: np.int64) -> int:
    """Slot holding `key`, or the empty slot where it belongs."""
    mask = keys.shape[0] - 1
    i = key & mask
    while keys[i] != 0 and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def _upsert(keys: np.ndarray, vals: np.ndarray, stats: np.ndarray, key: np.int64) -> int:
    i = _slot_for(keys, key)
    if keys[i] == 0:
        keys[i] = key
        vals[i, COUNT] = 0
        vals[i, BEST] = -1
        vals[i, BEST_COUNT] = 0
        stats[ENTRIES] += 1
    return i


@njit(cache=True, nogil=True)
def decay(keys: np.ndarray, vals: np.ndarray, stats: np.ndarray, capacity: int) -> None:
    """Halve every count and drop entries left at 0, until at most capacity // 2 entries remain."""
    while stats[ENTRIES] > capacity // 2:
        old_keys, old_vals = keys.copy(), vals.copy()
        keys[:] = 0
        stats[ENTRIES] = 0
        for s in range(old_keys.shape[0]):
            count = old_vals[s, COUNT] // 2
            if old_keys[s] == 0 or count == 0:
                continue
            i = _slot_for(keys, old_keys[s])
            keys[i] = old_keys[s]
            vals[i, COUNT] = count
            vals[i, BEST] = old_vals[s, BEST]
            vals[i, BEST_COUNT] = old_vals[s, BEST_COUNT] // 2
            stats[ENTRIES] += 1


@njit(cache=True, nogil=True)
def learn(keys, vals, stats, tokens: np.ndarray, first: int, end: int, max_n: int, capacity: int) -> None:
    """Count tokens[first:end] as followers of their 1..max_n - 1 preceding tokens (which may lie
    before `first`: the prompt gives context, only outputs are learned as continuations)."""
    for j in range(first, end):
        if stats[ENTRIES] + 2 * (max_n - 1) > capacity:
            decay(keys, vals, stats, capacity)
        x = tokens[j]
        for n in range(1, min(max_n - 1, j) + 1):
            c = _upsert(keys, vals, stats, gram_key(tokens, j - n, n, CONTEXT_KIND))
            vals[c, COUNT] += 1
            p = _upsert(keys, vals, stats, gram_key(tokens, j - n, n + 1, PAIR_KIND))
            vals[p, COUNT] += 1
            if vals[p, COUNT] >= vals[c, BEST_COUNT]:
                vals[c, BEST] = x
                vals[c, BEST_COUNT] = vals[p, COUNT]


@njit(cache=True, nogil=True)
def find_context(keys: np.ndarray, tokens: np.ndarray, start: int, n: int) -> int:
    """Slot of the context tokens[start : start + n], or -1."""
    if keys.shape[0] == 0:
        return -1
    return find_key(keys, gram_key(tokens, start, n, CONTEXT_KIND))


DEFAULT_CAPACITY = 1 << 20  # entries


class NgramMemory:
    """The shared table and its cap; `learn` a finished request, `save` and `load` it across restarts."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, max_n: int = 4) -> None:
        if capacity < 16:
            raise ValueError(f"memory capacity must be >= 16 entries, got {capacity}")
        if max_n < 2:
            raise ValueError(f"memory max_n must be >= 2, got {max_n}")
        self.capacity, self.max_n = capacity, max_n
        slots = 1 << (2 * capacity - 1).bit_length()  # a power of two >= 2 * capacity
        self.keys = np.zeros(slots, dtype=np.int64)
        self.vals = np.zeros((slots, FIELDS), dtype=np.int32)
        self.stats = np.zeros(1, dtype=np.int64)
        tokens = np.arange(4, dtype=np.int32)
        learn(np.zeros(64, np.int64), np.zeros((64, FIELDS), np.int32), np.zeros(1, np.int64), tokens, 1, 4, 2, 16)
        find_context(self.keys, tokens, 0, 1)  # compile before any request

    @property
    def entries(self) -> int:
        return int(self.stats[ENTRIES])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def learn(self, tokens: np.ndarray, first: int, end: int) -> None:
        """Learn the outputs tokens[first:end]; tokens before `first` serve as their context only."""
        assert tokens.dtype == np.int32 and 0 <= first <= end <= len(tokens), (tokens.dtype, first, end)
        learn(self.keys, self.vals, self.stats, tokens, first, end, self.max_n, self.capacity)

    def save(self, path: str | os.PathLike) -> None:
        """Write the memory to `path` (replaced atomically)."""
        path = Path(path)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as f:
            config = np.array([FORMAT_VERSION, self.max_n, self.capacity], dtype=np.int64)
            np.savez(f, config=config, keys=self.keys, vals=self.vals, stats=self.stats)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "NgramMemory":
        """The memory `save` wrote at `path`; ValueError naming the path where it is not one."""
        with open_saved(path) as data:
            version, max_n, capacity = (int(v) for v in data["config"])
            if version != FORMAT_VERSION:
                raise ValueError(f"{path}: memory format {version}, expected {FORMAT_VERSION}")
            memory = cls(capacity=capacity, max_n=max_n)
            if data["keys"].shape != memory.keys.shape or data["vals"].shape != memory.vals.shape:
                raise ValueError(f"{path}: table shape does not match its capacity {capacity}")
            memory.keys[:], memory.vals[:], memory.stats[:] = data["keys"], data["vals"], data["stats"]
        return memory


SAVED = ("config", "keys", "vals", "stats")  # the arrays `NgramMemory.save` writes


def open_saved(path: str | os.PathLike) -> np.lib.npyio.NpzFile:
    """The arrays of a memory saved at `path`, opened (read as far as their names, so a check costs
    nothing); ValueError naming the path where it is no such file (a directory, a device, another file)."""
    path = Path(path)
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise ValueError(f"{path} is not an n-gram memory file: {what}")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        data = None
    if not isinstance(data, np.lib.npyio.NpzFile) or not set(SAVED) <= set(data.files):
        if isinstance(data, np.lib.npyio.NpzFile):
            data.close()
        raise ValueError(f"{path} is not an n-gram memory file (a NumPy archive of {', '.join(SAVED)})")
    return data
