"""`RowTracker` driven with fake vLLM inputs (no vLLM needed): a fake persistent
batch that moves rows the way vLLM's does (removal, condensing the last rows into holes, new requests
taking the lowest free rows, swaps, chunked prefills with empty sampled ids, preemption, unscheduled
steps, skipped propose calls). A drafter whose drafts are a hash of the whole context it was fed makes
any context the tracker got wrong show up as a wrong draft."""

from __future__ import annotations

import random
import zlib
from typing import Sequence

import numpy as np
import pytest

from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.integrations.rows import WINDOW, RowTracker
from specdraft.params import SamplingParams

VOCAB = 50
MAX_LEN = 400


def context_draft(context: Sequence[int], limit: int) -> list[int]:
    """The reference draft: a function of every token of the context."""
    h = zlib.crc32(np.asarray(context, dtype=np.int32).tobytes())
    return [(h >> (3 * j)) % VOCAB for j in range(limit)]


class ContextDrafter:
    """Drafts `context_draft` of the context it was given through begin/accept; counts its calls."""

    def __init__(self) -> None:
        self.contexts: dict[str, list[int]] = {}
        self.begun = 0
        self.ended: list[str] = []

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        assert request_id not in self.contexts
        self.contexts[request_id] = [int(t) for t in prompt_ids]
        self.begun += 1

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = [context_draft(self.contexts[r], n) for r, n in zip(request_ids, max_lengths)]
        return [Draft(np.asarray(d, dtype=np.int32)) if d else EMPTY_DRAFT for d in drafts]

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.contexts[request_id].extend(int(t) for t in token_ids)

    def end(self, request_id: str) -> None:
        del self.contexts[request_id]
        self.ended.append(request_id)


class FakeRequest:
    def __init__(self, name: str, prompt: list[int], budget: int, chunks: int) -> None:
        self.name, self.context, self.budget, self.chunks_left = name, list(prompt), budget, chunks
        self.generated, self.draft = 0, []

    @property
    def done(self) -> bool:
        return self.generated >= self.budget


class FakeBatch:
    """vLLM's persistent batch as the proposer sees it: rows 0..num_reqs-1, `token_ids` (stale tokens
    past each row's length, as in vLLM), `num_tokens`, and a step that samples for every row."""

    def __init__(self, rows: int, rng: random.Random) -> None:
        self.rng = rng
        self.rows: list[FakeRequest | None] = []
        self.token_ids = np.asarray(rng.choices(range(VOCAB), k=rows * MAX_LEN), dtype=np.int32).reshape(rows, MAX_LEN)
        self.num_tokens = np.zeros(rows, dtype=np.int32)
        self.max_rows = rows

    def remove(self, request: FakeRequest) -> None:
        self.rows[self.rows.index(request)] = None

    def add(self, request: FakeRequest) -> None:
        """Into the lowest hole, else at the end; the row gets the whole context (vLLM's add_request)."""
        free = [i for i, r in enumerate(self.rows) if r is None]
        i = free[0] if free else len(self.rows)
        assert i < self.max_rows
        if i == len(self.rows):
            self.rows.append(None)
        self.rows[i] = request
        self.token_ids[i, : len(request.context)] = request.context
        self.num_tokens[i] = len(request.context)

    def condense(self) -> None:
        """Move the last requests down into the holes, copying their tokens (vLLM's condense)."""
        while None in self.rows:
            hole = self.rows.index(None)
            last = max(i for i, r in enumerate(self.rows) if r is not None) if any(self.rows) else -1
            if last < hole:
                del self.rows[hole:]
                break
            n = self.num_tokens[last]
            self.token_ids[hole, :n] = self.token_ids[last, :n]
            self.num_tokens[hole] = n
            self.rows[hole], self.rows[last] = self.rows[last], None

    def swap(self, i: int, j: int) -> None:
        n = max(self.num_tokens[i], self.num_tokens[j])
        self.token_ids[[i, j], :n] = self.token_ids[[j, i], :n]
        self.num_tokens[[i, j]] = self.num_tokens[[j, i]]
        self.rows[i], self.rows[j] = self.rows[j], self.rows[i]

    def sample(self, use_drafts: bool = True) -> list[list[int]]:
        """One forward pass: a chunk of each prefill, else an accepted prefix of the draft plus one token."""
        sampled = []
        for i, request in enumerate(self.rows):
            if request.chunks_left > 1:
                request.chunks_left -= 1
                sampled.append([])
                continue
            request.chunks_left = 0
            draft = request.draft if use_drafts else []
            accepted = self.rng.randint(0, len(draft))
            new = draft[:accepted] + [self.rng.randrange(VOCAB)]
            new = new[: max(1, request.budget - request.generated)]
            n = self.num_tokens[i]
            self.token_ids[i, n : n + len(new)] = new
            self.num_tokens[i] = n + len(new)
            request.context += new
            request.generated += len(new)
            sampled.append(new)
        return sampled


def check_drafts(batch: FakeBatch, sampled: list[list[int]], drafts: list[list[int]], k: int) -> None:
    """Every row's draft is the reference draft of its request's true context (none mid-prefill)."""
    assert len(drafts) == len(batch.rows)
    for request, new, draft in zip(batch.rows, sampled, drafts):
        limit = min(k, MAX_LEN - len(request.context))
        assert draft == (context_draft(request.context, limit) if new and limit > 0 else []), request.name
        request.draft = draft


def run_traffic(seed: int, k: int = 4, rows: int = 6, requests: int = 40, preempt: float = 0.05,
                unschedule: float = 0.05, swap: float = 0.2) -> tuple[RowTracker, ContextDrafter, int]:
    """Random traffic through a FakeBatch; returns the tracker, its drafter and how many requests ran."""
    rng = random.Random(seed)
    drafter = ContextDrafter()
    # Absent requests are kept long enough here that every preempted one comes back in time.
    tracker = RowTracker(drafter, k=k, max_model_len=MAX_LEN, grace_steps=10_000, capacity=requests)
    batch = FakeBatch(rows, rng)
    waiting = [FakeRequest(f"r{j}", rng.choices(range(VOCAB), k=rng.randint(1, 120)), rng.randint(1, 60),
                           rng.randint(1, 3)) for j in range(requests)]
    started = 0
    back_next_step: list[FakeRequest] = []
    while waiting or any(batch.rows) or back_next_step:
        for request in [r for r in batch.rows if r is not None and r.done]:
            batch.remove(request)
        for request in back_next_step:
            batch.add(request)
        back_next_step = []
        for request in [r for r in batch.rows if r is not None and r.chunks_left == 0]:
            roll = rng.random()
            if roll < preempt:  # preempted: back later, its whole context recomputed in chunks
                batch.remove(request)
                request.chunks_left, request.draft = rng.randint(1, 3), []
                waiting.insert(rng.randint(0, min(3, len(waiting))), request)
            elif roll < preempt + unschedule:  # left out of one step, then back with its draft
                batch.remove(request)
                back_next_step.append(request)
        batch.condense()
        while waiting and sum(r is not None for r in batch.rows) + len(back_next_step) < rows:
            request = waiting.pop(0)
            started += request.generated == 0
            batch.add(request)
        if len(batch.rows) >= 2 and rng.random() < swap:
            batch.swap(*rng.sample(range(len(batch.rows)), 2))
        if not any(batch.rows):
            continue
        sampled = batch.sample()
        check_drafts(batch, sampled, tracker.step(sampled, batch.num_tokens, batch.token_ids), k)
    return tracker, drafter, started


@pytest.mark.parametrize("seed", range(12))
def test_random_traffic_drafts_from_each_requests_own_context_and_builds_it_once(seed):
    tracker, drafter, started = run_traffic(seed)
    assert started == 40
    # Built once per request: compaction, reuse, swaps, preemption and unscheduled steps rebuild nothing.
    assert drafter.begun == tracker.stats.begun == 40
    assert tracker.stats.rematched > 0
    tracker.close()
    assert drafter.contexts == {} and len(drafter.ended) == 40


def test_control_a_tracker_that_ignores_moves_drafts_wrongly():
    """Negative control for the test above: pin every row to the request it held first and the
    reference drafts no longer match, so the check can fail."""

    class PinnedRows(RowTracker):
        def _follow(self, request, row, n, new, same_row):
            if not same_row:
                return False
            if len(new):
                self.drafter.accept(request.id, new)
                request.extend(new)
            return True

    rng = random.Random(0)
    drafter = ContextDrafter()
    tracker = PinnedRows(drafter, k=3, max_model_len=MAX_LEN)
    batch = FakeBatch(3, rng)
    for j in range(3):
        batch.add(FakeRequest(f"r{j}", rng.choices(range(VOCAB), k=20 + j), budget=50, chunks=1))
    check_drafts(batch, s := batch.sample(), tracker.step(s, batch.num_tokens, batch.token_ids), 3)
    batch.swap(0, 2)
    sampled = batch.sample()
    with pytest.raises(AssertionError):
        check_drafts(batch, sampled, tracker.step(sampled, batch.num_tokens, batch.token_ids), 3)


def start(batch: FakeBatch, tracker: RowTracker, requests: list[FakeRequest], k: int = 3) -> None:
    for request in requests:
        batch.add(request)
    step(batch, tracker, k)


def step(batch: FakeBatch, tracker: RowTracker, k: int = 3, use_drafts: bool = True) -> list[list[int]]:
    sampled = batch.sample(use_drafts)
    drafts = tracker.step(sampled, batch.num_tokens, batch.token_ids)
    check_drafts(batch, sampled, drafts, k)
    return drafts


def make(rows: int = 4, seed: int = 0, **kwargs) -> tuple[FakeBatch, RowTracker, ContextDrafter, random.Random]:
    rng = random.Random(seed)
    drafter = ContextDrafter()
    return FakeBatch(rows, rng), RowTracker(drafter, k=3, max_model_len=MAX_LEN, **kwargs), drafter, rng


def fresh(rng: random.Random, name: str, length: int, budget: int = 100, chunks: int = 1) -> FakeRequest:
    return FakeRequest(name, rng.choices(range(VOCAB), k=length), budget, chunks)


def test_compaction_moves_a_request_without_rebuilding_it():
    batch, tracker, drafter, rng = make()
    a, b, c, d = (fresh(rng, n, 30 + 5 * j) for j, n in enumerate("abcd"))
    start(batch, tracker, [a, b, c, d])
    batch.remove(b)
    batch.condense()  # d moves from row 3 into row 1
    assert batch.rows == [a, d, c]
    step(batch, tracker)
    assert (drafter.begun, tracker.stats.rematched) == (4, 1)
    assert drafter.ended == []  # b is kept for a while in case it comes back (grace)


def test_new_request_takes_a_freed_row_and_the_finished_one_is_ended_after_grace():
    batch, tracker, drafter, rng = make(grace_steps=3)
    a, b = fresh(rng, "a", 40), fresh(rng, "b", 41)
    start(batch, tracker, [a, b])
    batch.remove(a)
    c = fresh(rng, "c", 40)
    batch.add(c)  # takes row 0
    assert batch.rows == [c, b]
    step(batch, tracker)
    assert drafter.begun == 3
    for _ in range(3):
        step(batch, tracker)
    assert len(drafter.ended) == 1 and set(drafter.contexts) == {tracker._held[0].id, tracker._held[1].id}
    assert tracker.live == 2


def test_chunked_prefill_is_begun_once_and_drafted_only_when_complete():
    batch, tracker, drafter, rng = make()
    a = fresh(rng, "a", 90, chunks=3)
    batch.add(a)
    assert step(batch, tracker) == [[]] and step(batch, tracker) == [[]]  # empty sampled ids: no draft
    assert drafter.begun == 1 and drafter.contexts[tracker._held[0].id] == a.context  # the whole prompt
    assert step(batch, tracker)[0]  # prefill done: drafted
    assert drafter.begun == 1


def test_preempted_request_coming_back_is_matched_without_rebuild():
    batch, tracker, drafter, rng = make()
    a, b = fresh(rng, "a", 50), fresh(rng, "b", 60)
    start(batch, tracker, [a, b])
    step(batch, tracker)
    batch.remove(a)
    batch.condense()
    step(batch, tracker)
    a.chunks_left, a.draft = 2, []
    batch.add(a)  # recompute: whole context, empty sampled ids, then a token
    step(batch, tracker)
    step(batch, tracker)
    assert drafter.begun == 2 and tracker.stats.rematched == 2  # b moved to row 0, a came back


def test_absent_requests_beyond_capacity_are_ended_longest_absent_first():
    batch, tracker, drafter, rng = make(rows=6, capacity=2)
    requests = [fresh(rng, f"r{j}", 20 + j) for j in range(5)]
    start(batch, tracker, requests)
    ids = [r.id for r in tracker._held]
    for request in requests[:3]:
        batch.remove(request)
    batch.condense()
    step(batch, tracker)
    assert drafter.ended == ids[:1] and tracker.live == 4


def test_skipped_propose_call_is_caught_up_from_the_row():
    batch, tracker, drafter, rng = make()
    a = fresh(rng, "a", 30)
    start(batch, tracker, [a])
    batch.sample(use_drafts=False)  # a step in which vLLM did not call propose
    step(batch, tracker, use_drafts=False)
    assert drafter.begun == 1


def test_other_request_of_same_length_and_tail_is_rebuilt_at_once():
    batch, tracker, drafter, rng = make()
    a = fresh(rng, "a", 60)
    start(batch, tracker, [a])
    step(batch, tracker)
    # vLLM replaced the row's request by another one, equal in length and last tokens but
    # different at the start: the spread probes see it in the same step.
    other = FakeRequest("other", list(a.context), 100, 1)
    other.context[0] = (other.context[0] + 1) % VOCAB
    batch.remove(a)
    batch.add(other)
    other.draft = a.draft
    step(batch, tracker)
    assert drafter.begun == 2


def test_difference_between_probes_is_found_by_the_moving_window():
    batch, tracker, drafter, rng = make()
    a = fresh(rng, "a", 300, budget=300)
    start(batch, tracker, [a])
    # Change one token that the tail and spread probes do not look at: the window finds it within
    # ceil(L / WINDOW) steps and the request is rebuilt from the row.
    hidden = 300 // 8 + 5
    batch.token_ids[0, hidden] = (batch.token_ids[0, hidden] + 1) % VOCAB
    a.context[hidden] = int(batch.token_ids[0, hidden])
    steps = 0
    while drafter.begun == 1:
        sampled = batch.sample()
        drafts = tracker.step(sampled, batch.num_tokens, batch.token_ids)
        a.draft = drafts[0]
        steps += 1
        assert steps <= -(-len(a.context) // WINDOW) + 1
    check_drafts(batch, [[0]], drafts, 3)  # from the row's context again


def test_no_draft_reaches_past_max_model_len():
    drafter = ContextDrafter()
    tracker = RowTracker(drafter, k=5, max_model_len=12)
    tokens = np.zeros((1, 12), dtype=np.int32)
    tokens[0, :10] = np.arange(10)
    assert tracker.step([[9]], np.array([10]), tokens) == [context_draft(range(10), 2)]
    tokens[0, 10:12] = [1, 2]
    assert tracker.step([[1, 2]], np.array([12]), tokens) == [[]]
