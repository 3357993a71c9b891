"""The default `ngram` drafter: exact copies by prompt lookup, the n-gram frequency model for the rest,
an adaptive draft length per request; deterministic drafts (probs None) at a per-step cost that does
not grow with the context (indexed tables, see `ngram_table`).

A draft of at most d = min(max_length, k) tokens (or fewer by the adaptive rule below), in three stages:
1. Copy: the continuation of the longest (max_n down to copy_min_n), most recent earlier occurrence
   of the context's suffix, up to d tokens and never past the end of the context.
2. Chain: while the draft is shorter than d, predict the most frequent follower of the longest
   context (max_n - 1 down to 1 tokens, over the context plus the draft so far) seen before, first
   in the request's own table and then, at the same order, in the cross-request memory if enabled.
   Its confidence is the share of that context's occurrences it followed; the draft stops before a
   token whose confidence is below `min_confidence`, or when no context has been seen.
3. EOS: the draft ends after an EOS token (kept: the target may accept it), unless the request
   ignores EOS.

Adaptive draft length, per request (off by default: in the engine the cost-aware policy of
`specdraft.policy` owns draft lengths; the rule suits hosts without one, such as vLLM): k_cur
starts at k. After a step whose draft had d >= 1 tokens
of which a were accepted (read off the tokens passed to `accept`), a == 0 halves k_cur (to no less
than 1), a == d >= k_cur raises it by 2 (to no more than k), anything else leaves it. k_cur caps a
draft only in steps that draft for at least `adapt_from_batch` requests (default 1: always), and
not when the copy comes from a match of at least `strong_copy_n` tokens (a copy in progress).
Why: on CPU each verified draft token costs a good share of a step (benchmarks/results/cpu/verify_cost.md),
so drafts that keep failing should shrink (what it gains: benchmarks/results/serving/adaptive.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from numba import njit, types
from numba.typed import List

from specdraft.drafters import memory as mem
from specdraft.drafters.base import EMPTY_DRAFT, Cost, Draft, Parts, Resources
from specdraft.drafters.buffers import grown
from specdraft.drafters.memory import NgramMemory
from specdraft.drafters.registry import register
from specdraft.drafters.ngram_table import BEST, BEST_COUNT, COUNT, FIELDS, extend, find, longest_match, new_table
from specdraft.drafters.ngram_table import rehash, slots_for, warm_up
from specdraft.params import DEFAULT_NUM_SPECULATIVE_TOKENS, SamplingParams

# Per-request state: one int64 row of `meta` per slot.
LENGTH = 0  # tokens in the context
PROMPT_LENGTH = 1
K_CUR = 2  # adaptive draft length
DRAFTED = 3  # length of the last draft, which sits in tokens[LENGTH : LENGTH + DRAFTED]
IGNORE_EOS = 4
MATCH = 5  # length of the suffix match the last draft copied from (0: no copy)
META_FIELDS = 6

# A draft's kind (`Draft.kind`): the length of the match it copies after, or a chain of followers.
# Measured on the embedded model, a 1-token match's copy is accepted about a third as often as a
# 4-token match's: the cost-aware policy must tell them apart. A match found through the tables
# (at most max_n tokens) is extended backwards, up to LONG_MATCH tokens, and matches of 4 tokens and
# more are told apart by powers of two (copy4, copy8, copy16, copy32): a long match is a copy in
# progress (a function being rewritten, a schema's keys), whose continuation is accepted far further,
# so the policy can learn to verify it in long drafts (SuffixDecoding sizes drafts by match length).
LONG_MATCH = 32


def _kind(match: int) -> str:
    if not match:
        return "chain"
    bucket = match if match < 4 else 1 << (min(int(match), LONG_MATCH).bit_length() - 1)
    return f"copy{bucket}"


BEGIN_ROOM = 4096  # output tokens a request's buffers are sized for at `begin`


@njit(cache=True, nogil=True)
def _is_eos(token: int, eos: np.ndarray) -> bool:
    for e in eos:
        if token == e:
            return True
    return False


@njit(cache=True, nogil=True)
def draft_one(tokens, table, meta, slot, limit, adapt, copy_min_n, strong_n, min_confidence, eos,
              mem_keys, mem_vals, mem_max_n, out) -> int:
    """Write the request's draft into `out` and into its scratch tokens[length:]; return its length."""
    length = meta[slot, LENGTH]
    max_n = table.shape[0]
    # Also bounded by the buffers (out is k wide), so that no state can make the kernel write out of bounds.
    d = min(limit, out.shape[0], tokens.shape[0] - length)
    start, n = longest_match(tokens, table, length, copy_min_n, max_n)
    match = n
    while start >= 0 and match < LONG_MATCH and start - match - 1 >= 0 \
            and tokens[start - match - 1] == tokens[length - match - 1]:
        match += 1  # the earlier occurrence is tokens[start - n : start]; how far back it agrees
    meta[slot, MATCH] = match
    if adapt and n < strong_n:
        d = min(d, meta[slot, K_CUR])
    stop_at_eos = meta[slot, IGNORE_EOS] == 0
    count = 0
    while start >= 0 and count < d and start + count < length:
        token = tokens[start + count]
        tokens[length + count] = token
        out[count] = token
        count += 1
        if stop_at_eos and _is_eos(token, eos):
            meta[slot, DRAFTED] = count
            return count
    while count < d:
        end = length + count
        token, best_count, total = -1, 0, 0
        for n in range(min(max_n - 1, end), 0, -1):
            i = find(tokens, table, n, end - n)
            if i >= 0:
                token, best_count, total = table[n - 1, i, BEST], table[n - 1, i, BEST_COUNT], table[n - 1, i, COUNT]
                break
            j = mem.find_context(mem_keys, tokens, end - n, n) if n < mem_max_n else -1
            if j >= 0:
                token, best_count, total = mem_vals[j, mem.BEST], mem_vals[j, mem.BEST_COUNT], mem_vals[j, mem.COUNT]
                break
        if token < 0 or best_count < min_confidence * total:
            break
        tokens[end] = token
        out[count] = token
        count += 1
        if stop_at_eos and _is_eos(token, eos):
            break
    meta[slot, DRAFTED] = count
    return count


@njit(cache=True, nogil=True)
def draft_batch(tokens_by_slot, tables_by_slot, meta, slots, limits, adapt, copy_min_n, strong_n, min_confidence,
                eos, mem_keys, mem_vals, mem_max_n, out, lengths) -> None:
    """Drafts for many requests in one call: row b of `out` ([batch, k], padded with -1) and
    lengths[b] for the request in slots[b], at most limits[b] tokens."""
    for b in range(slots.shape[0]):
        s = slots[b]
        n = draft_one(tokens_by_slot[s], tables_by_slot[s], meta, s, limits[b], adapt, copy_min_n, strong_n,
                      min_confidence, eos, mem_keys, mem_vals, mem_max_n, out[b])
        out[b, n:] = -1
        lengths[b] = n


@njit(cache=True, nogil=True)
def accept_tokens(tokens, table, meta, slot, new, k) -> None:
    """Update k_cur from how much of the last draft `new` confirms, then append `new` to the context."""
    length, drafted = meta[slot, LENGTH], meta[slot, DRAFTED]
    if drafted > 0:
        accepted = 0
        while accepted < drafted and accepted < new.shape[0] and new[accepted] == tokens[length + accepted]:
            accepted += 1
        if accepted == 0:
            meta[slot, K_CUR] = max(1, meta[slot, K_CUR] // 2)
        elif accepted == drafted and drafted >= meta[slot, K_CUR]:
            meta[slot, K_CUR] = min(k, meta[slot, K_CUR] + 2)
    meta[slot, DRAFTED] = 0
    meta[slot, LENGTH] = extend(tokens, table, length, new)


_NO_MEMORY = (np.empty(0, dtype=np.int64), np.empty((0, mem.FIELDS), dtype=np.int32), 0)
_TOKENS_TYPE = types.Array(types.int32, 1, "C")
_TABLE_TYPE = types.Array(types.int32, 3, "C")


# Typed-list operations as our own cached kernels: called from Python, numba would compile its own
# on every start.
@njit(cache=True)
def _empty_tokens_list():
    return List.empty_list(_TOKENS_TYPE)


@njit(cache=True)
def _empty_tables_list():
    return List.empty_list(_TABLE_TYPE)


@njit(cache=True)
def _put(arrays, slot, array) -> None:
    while len(arrays) <= slot:
        arrays.append(array)
    arrays[slot] = array


class NgramDrafter:
    """Prompt lookup plus n-gram model per request, with optional cross-request memory.

    Cheap: a draft costs microseconds, so the engine asks for full-length drafts before it chooses
    the step's draft length and trims them.

    k: longest draft; eos_token_ids: where drafts end; max_n: longest n-gram indexed (contexts are
    up to max_n - 1 tokens); copy_min_n: shortest suffix match that is copied (above max_n: never
    copy); min_confidence: stop the model's chain below this count share; adaptive,
    adapt_from_batch, strong_copy_n: the k_cur rule above (adaptive=False: drafts up to k); memory:
    shared across requests (None: off).
    """

    def __init__(
        self,
        k: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
        eos_token_ids: Sequence[int] = (),
        max_n: int = 4,
        copy_min_n: int = 1,
        min_confidence: float = 0.5,
        adaptive: bool = False,
        adapt_from_batch: int = 1,
        strong_copy_n: int = 3,
        memory: NgramMemory | None = None,
    ) -> None:
        assert k >= 0, k  # checked where requests and drafters are built (`specdraft.params`)
        if max_n < 2:
            raise ValueError(f"max_n must be >= 2, got {max_n}")
        if copy_min_n < 1:
            raise ValueError(f"copy_min_n must be >= 1, got {copy_min_n}")
        if not 0.0 <= min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {min_confidence}")
        if adapt_from_batch < 1:
            raise ValueError(f"adapt_from_batch must be >= 1, got {adapt_from_batch}")
        self.k, self.max_n, self.copy_min_n, self.min_confidence = k, max_n, copy_min_n, float(min_confidence)
        self.adaptive, self.adapt_from_batch, self.strong_copy_n = adaptive, adapt_from_batch, strong_copy_n
        self.eos = np.asarray(sorted(set(eos_token_ids)), dtype=np.int32)
        self.memory = memory
        self.parts = Parts(self, free_cost=Cost.FREE)  # microseconds a draft: asked at full length first
        self._slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self._meta = np.zeros((0, META_FIELDS), dtype=np.int64)
        # Per slot, the request's arrays: Python lists for per-request calls, typed lists mirroring
        # them for the batch kernel (updated only when a request starts or an array grows).
        self._tokens: list[np.ndarray] = []
        self._tables: list[np.ndarray] = []
        self._tokens_by_slot = _empty_tokens_list()
        self._tables_by_slot = _empty_tables_list()
        self._out = np.empty((0, k), dtype=np.int32)  # [batch, k], padded with -1
        self._lengths = np.empty(0, dtype=np.int64)
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (or load from numba's cache) every kernel, so that no request pays for it."""
        warm_up()
        memory, self.memory = self.memory, None  # the warm-up request must not teach the shared memory
        self.begin("warm-up", [1, 2, 3, 1, 2], SamplingParams())
        self.begin("warm-up 2", [], SamplingParams())
        self.propose(["warm-up"], [self.k])  # one request, then a batch: two entry points
        self.propose(["warm-up", "warm-up 2"], [self.k, self.k])
        self.accept("warm-up", [3, 1])
        self.end("warm-up")
        self.end("warm-up 2")
        self.memory = memory

    @property
    def _memory_arrays(self) -> tuple[np.ndarray, np.ndarray, int]:
        if self.memory is None:
            return _NO_MEMORY
        return self.memory.keys, self.memory.vals, self.memory.max_n

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        assert request_id not in self._slot_of, f"request {request_id!r} already begun"
        slot = self._take_slot()
        prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(-1)
        # Room for the prompt and (up to a point) its budget, so that decoding rarely has to grow them
        # (a request resolved by the engine always has a limit; one begun directly may name none).
        room = len(prompt) + min(params.max_tokens or BEGIN_ROOM, BEGIN_ROOM)
        tokens = np.empty(max(64, room + self.k), dtype=np.int32)
        table = new_table(self.max_n, room)
        self._set_arrays(slot, tokens, table)
        self._meta[slot] = 0
        self._meta[slot, K_CUR] = self.k
        self._meta[slot, IGNORE_EOS] = params.ignore_eos
        self._meta[slot, PROMPT_LENGTH] = len(prompt)
        self._meta[slot, LENGTH] = extend(tokens, table, 0, prompt)
        self._slot_of[request_id] = slot

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        batch = len(request_ids)
        self._out, self._lengths = grown(self._out, batch, keep=0), grown(self._lengths, batch, keep=0)
        out = self._out[:batch]
        adapt = self.adaptive and batch >= self.adapt_from_batch
        settings = (adapt, self.copy_min_n, self.strong_copy_n, self.min_confidence, self.eos, *self._memory_arrays)
        if batch == 1:  # the same kernel without the typed lists, whose unboxing costs microseconds a call
            slot = self._slot_of[request_ids[0]]
            limit = int(max_lengths[0])
            n = draft_one(self._tokens[slot], self._tables[slot], self._meta, slot, limit, *settings, out[0])
            return [Draft(out[0, :n].copy(), kind=_kind(self._meta[slot, MATCH])) if n else EMPTY_DRAFT]
        slots = np.array([self._slot_of[r] for r in request_ids], dtype=np.int64)
        limits = np.asarray(max_lengths, dtype=np.int64)
        lengths = self._lengths[:batch]
        draft_batch(self._tokens_by_slot, self._tables_by_slot, self._meta, slots, limits, *settings, out, lengths)
        matches = self._meta[slots, MATCH].tolist()
        return [Draft(out[b, :n].copy(), kind=_kind(m)) if n else EMPTY_DRAFT
                for b, (n, m) in enumerate(zip(lengths.tolist(), matches))]

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        slot = self._slot_of[request_id]
        new = np.asarray(token_ids, dtype=np.int32).reshape(-1)
        tokens, table = self._tokens[slot], self._tables[slot]
        end = int(self._meta[slot, LENGTH]) + len(new)
        if end + self.k > len(tokens) or 2 * end > table.shape[1]:
            tokens, table = self._grow(slot, end)
        accept_tokens(tokens, table, self._meta, slot, new, self.k)

    def end(self, request_id: str) -> None:
        slot = self._slot_of.pop(request_id, None)
        if slot is None:
            return
        if self.memory is not None:
            length, prompt_length = self._meta[slot, LENGTH], self._meta[slot, PROMPT_LENGTH]
            self.memory.learn(self._tokens[slot], int(prompt_length), int(length))
        self._set_arrays(slot, np.empty(0, dtype=np.int32), np.zeros((self.max_n, 1, FIELDS), dtype=np.int32))
        self._free.append(slot)

    def match_length(self, request_id: str) -> int:
        """Length of the context suffix whose earlier occurrence the request's last draft copied
        from (0: the draft was not a copy; at most LONG_MATCH). A long match is a confident draft."""
        return int(self._meta[self._slot_of[request_id], MATCH])

    def table_nbytes(self, request_id: str) -> int:
        """Bytes held for one request: its token buffer and its tables."""
        slot = self._slot_of[request_id]
        return self._tokens[slot].nbytes + self._tables[slot].nbytes

    # -- slots and growth -------------------------------------------------------------------
    def _take_slot(self) -> int:
        if not self._free:
            slot = len(self._tokens)
            self._tokens.append(np.empty(0, dtype=np.int32))
            self._tables.append(np.zeros((self.max_n, 1, FIELDS), dtype=np.int32))
            self._set_arrays(slot, self._tokens[slot], self._tables[slot])
            self._meta = grown(self._meta, slot + 1)  # a slot's row is set when a request takes it
            return slot
        return self._free.pop()

    def _set_arrays(self, slot: int, tokens: np.ndarray, table: np.ndarray) -> None:
        self._tokens[slot], self._tables[slot] = tokens, table
        _put(self._tokens_by_slot, slot, tokens)
        _put(self._tables_by_slot, slot, table)

    def _grow(self, slot: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Room for a context of `end` tokens plus a draft: doubling, so amortised O(1) per token."""
        # The scratch is kept too: `accept` compares the last draft with it.
        tokens, table = grown(self._tokens[slot], end + self.k), self._tables[slot]
        if 2 * end > table.shape[1]:
            table = rehash(tokens, table, slots_for(end))
        self._set_arrays(slot, tokens, table)
        return tokens, table


def open_memory(memory: bool, memory_path: str | None, capacity: int) -> NgramMemory | None:
    """The cross-request memory the options ask for: loaded from `memory_path` where it exists, new
    where `memory` is on or a path is given, else None."""
    if memory_path is not None and Path(memory_path).exists():
        return NgramMemory.load(memory_path)
    if memory or memory_path is not None:
        return NgramMemory(capacity=capacity)
    return None


@register("ngram", options=NgramDrafter)
def _create(k: int, target: Any = None, resources: Resources | None = None, eos_token_ids: Sequence[int] | None = None,
            memory: bool = False, memory_path: str | None = None, memory_capacity: int = mem.DEFAULT_CAPACITY,
            **options: Any) -> NgramDrafter:
    """`eos_token_ids` default to the target's; `memory` (or a `memory_path` to load it from and save
    it to) turns on the cross-request memory: one per runtime and path (`resources`: `ngram` and
    `hybrid`'s n-gram part share it). The other options are `NgramDrafter`'s."""
    if eos_token_ids is None:
        eos_token_ids = () if target is None else target.eos_token_ids
    shared = None
    if memory or memory_path is not None:
        resources = resources if resources is not None else Resources()

        def make() -> NgramMemory:
            opened = open_memory(memory, memory_path, memory_capacity)
            if memory_path is not None:
                resources.on_save(lambda: opened.save(memory_path))
            return opened

        shared = resources.shared(("ngram memory", memory_path, memory_capacity), make)
    return NgramDrafter(k=k, eos_token_ids=eos_token_ids, memory=shared, **options)
