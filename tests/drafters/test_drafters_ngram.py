"""The indexed `ngram` drafter against naive pure-Python references: the prompt-lookup index, the
n-gram follower counts, the cross-request memory and the whole drafter (copy, chain, EOS, adaptive
length), on random token streams grown through many `accept` calls; plus edge cases and isolation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.drafters import Drafter, create_drafter
from specdraft.drafters.memory import NgramMemory
from specdraft.drafters.ngram import NgramDrafter
from specdraft.drafters.ngram_table import BEST, BEST_COUNT, COUNT, extend, find, longest_match, new_table, rehash
from specdraft.drafters.ngram_table import slots_for
from specdraft.drafters.prompt_lookup import scan_lookup
from specdraft.params import SamplingParams

EXAMPLES = 120


# -- naive references ----------------------------------------------------------------------------
def ref_longest_match(ctx: list[int], min_n: int, max_n: int) -> tuple[int, int]:
    """(start of the continuation, n) of the longest, most recent earlier occurrence of a suffix."""
    length = len(ctx)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        for start in range(length - n - 1, -1, -1):
            if ctx[start : start + n] == ctx[length - n :]:
                return start + n, n
    return -1, 0


def ref_follower(ctx: list[int], context: list[int]) -> tuple[int, int, int] | None:
    """(most frequent follower, ties to the most recent; its count; all followers) of `context` in ctx."""
    n, counts, last = len(context), {}, {}
    for start in range(len(ctx) - n):
        if ctx[start : start + n] == context:
            token = ctx[start + n]
            counts[token] = counts.get(token, 0) + 1
            last[token] = start
    if not counts:
        return None
    best = max(counts, key=lambda t: (counts[t], last[t]))
    return best, counts[best], sum(counts.values())


class RefMemory:
    """Dicts of exact n-grams with the memory's learn and decay rules."""

    def __init__(self, capacity: int, max_n: int) -> None:
        self.capacity, self.max_n = capacity, max_n
        self.contexts: dict[tuple, list[int]] = {}  # context -> [count, best, best_count]
        self.pairs: dict[tuple, int] = {}  # context + follower -> count

    @property
    def entries(self) -> int:
        return len(self.contexts) + len(self.pairs)

    def learn(self, tokens: list[int], first: int, end: int) -> None:
        for j in range(first, end):
            if self.entries + 2 * (self.max_n - 1) > self.capacity:
                self.decay()
            for n in range(1, min(self.max_n - 1, j) + 1):
                context = tuple(tokens[j - n : j])
                entry = self.contexts.setdefault(context, [0, -1, 0])
                entry[0] += 1
                pair = context + (tokens[j],)
                self.pairs[pair] = self.pairs.get(pair, 0) + 1
                if self.pairs[pair] >= entry[2]:
                    entry[1], entry[2] = tokens[j], self.pairs[pair]

    def decay(self) -> None:
        while self.entries > self.capacity // 2:
            self.contexts = {c: [e[0] // 2, e[1], e[2] // 2] for c, e in self.contexts.items() if e[0] // 2}
            self.pairs = {p: v // 2 for p, v in self.pairs.items() if v // 2}

    def predict(self, context: list[int]) -> tuple[int, int, int] | None:
        entry = self.contexts.get(tuple(context))
        return (entry[1], entry[2], entry[0]) if entry else None


class RefDrafter:
    """The `ngram` drafter's rules (module docstring of specdraft.drafters.ngram), written plainly."""

    def __init__(self, k, max_n=4, copy_min_n=1, min_confidence=0.5, adaptive=False, adapt_from_batch=1,
                 strong_copy_n=3, eos=(), memory=None):
        self.k, self.max_n, self.copy_min_n, self.min_confidence = k, max_n, copy_min_n, min_confidence
        self.adaptive, self.adapt_from_batch, self.strong_copy_n = adaptive, adapt_from_batch, strong_copy_n
        self.eos, self.memory = set(eos), memory
        self.ctx, self.prompt_length, self.k_cur, self.last, self.ignore_eos = {}, {}, {}, {}, {}

    def begin(self, rid, prompt, ignore_eos=False):
        self.ctx[rid], self.prompt_length[rid] = list(prompt), len(prompt)
        self.k_cur[rid], self.last[rid], self.ignore_eos[rid] = self.k, [], ignore_eos

    def propose(self, rid, limit, batch=1):
        ctx, draft = self.ctx[rid], []
        self.last[rid] = draft
        d = min(limit, self.k)
        start, n = ref_longest_match(ctx, self.copy_min_n, self.max_n)
        if self.adaptive and batch >= self.adapt_from_batch and n < self.strong_copy_n:
            d = min(d, self.k_cur[rid])

        def ends(token):
            return not self.ignore_eos[rid] and token in self.eos

        if start >= 0:
            for token in ctx[start : min(start + d, len(ctx))]:
                draft.append(token)
                if ends(token):
                    return draft
        while len(draft) < d:
            seq, pick = ctx + draft, None
            for n in range(min(self.max_n - 1, len(seq)), 0, -1):
                pick = ref_follower(ctx, seq[-n:])
                if pick is None and self.memory is not None and n < self.memory.max_n:
                    pick = self.memory.predict(seq[-n:])
                if pick is not None:
                    break
            if pick is None or pick[1] < self.min_confidence * pick[2]:
                break
            draft.append(pick[0])
            if ends(pick[0]):
                break
        return draft

    def accept(self, rid, tokens):
        last = self.last[rid]
        if last:
            accepted = 0
            while accepted < min(len(last), len(tokens)) and tokens[accepted] == last[accepted]:
                accepted += 1
            if accepted == 0:
                self.k_cur[rid] = max(1, self.k_cur[rid] // 2)
            elif accepted == len(last) >= self.k_cur[rid]:
                self.k_cur[rid] = min(self.k, self.k_cur[rid] + 2)
        self.last[rid] = []
        self.ctx[rid].extend(tokens)

    def end(self, rid):
        if self.memory is not None:
            self.memory.learn(self.ctx[rid], self.prompt_length[rid], len(self.ctx[rid]))
        del self.ctx[rid]


# -- strategies ----------------------------------------------------------------------------------
vocab_sizes = st.integers(2, 6)


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


# -- the index and the tables --------------------------------------------------------------------
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


# -- the drafter against the reference -----------------------------------------------------------
drafter_options = st.fixed_dictionaries(
    {
        "k": st.integers(1, 6),
        "max_n": st.integers(2, 5),
        "copy_min_n": st.integers(1, 6),
        "min_confidence": st.sampled_from([0.0, 0.3, 0.6, 1.0]),
        "adaptive": st.booleans(),
        "adapt_from_batch": st.integers(1, 3),  # the test drafts for 2 requests a step
        "strong_copy_n": st.integers(1, 5),
        "eos": st.sampled_from([(), (0,), (1, 2)]),
    }
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(drafter_options, st.booleans(), st.integers(16, 64), st.data())
def test_drafter_matches_reference(options, use_memory, capacity, data):
    vocab = data.draw(vocab_sizes)
    token = st.integers(0, vocab - 1)
    ref_memory = RefMemory(capacity, 3) if use_memory else None
    memory = NgramMemory(capacity=capacity, max_n=3) if use_memory else None
    eos = options.pop("eos")
    ref = RefDrafter(**options, eos=eos, memory=ref_memory)
    ours = NgramDrafter(**options, eos_token_ids=eos, memory=memory)
    assert isinstance(ours, Drafter)

    def start(rid):
        prompt, ignore_eos = data.draw(st.lists(token, max_size=40)), data.draw(st.booleans())
        max_tokens = data.draw(st.sampled_from([1, 128]))  # 1: the buffers grow during decoding
        ref.begin(rid, prompt, ignore_eos)
        ours.begin(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))

    # Three requests over two phases: "b" sees "a"'s outputs only through the memory.
    start("a")
    start("b")
    for phase in (("a", "b"), ("b", "c")):
        if phase == ("b", "c"):
            ref.end("a")
            ours.end("a")
            start("c")
        for _ in range(data.draw(st.integers(0, 30))):
            limits = [data.draw(st.integers(0, 7)) for _ in phase]
            drafts = ours.propose(list(phase), limits)
            for rid, limit, draft in zip(phase, limits, drafts):
                expected = ref.propose(rid, limit, batch=len(phase))
                assert draft.token_ids.tolist() == expected, (rid, limit)
                assert draft.probs is None and len(draft) <= limit
                # What the target keeps: a prefix of the draft, then its own token (or a new run).
                accepted = data.draw(st.one_of(st.just(len(expected)), st.integers(0, len(expected))))
                kept = expected[:accepted] + [data.draw(token)]
                if data.draw(st.integers(0, 9)) == 0:
                    kept = data.draw(st.lists(token, min_size=1, max_size=8))
                ref.accept(rid, kept)
                ours.accept(rid, kept)
    if use_memory:
        assert memory.entries == ref_memory.entries


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=40), min_size=1, max_size=6), st.integers(16, 48), st.data())
def test_memory_matches_reference(outputs, capacity, data):
    memory, ref = NgramMemory(capacity=capacity, max_n=4), RefMemory(capacity, 4)
    for output in outputs:
        first = data.draw(st.integers(0, len(output)))  # tokens before `first` are the prompt
        memory.learn(np.asarray(output, dtype=np.int32), first, len(output))
        ref.learn(output, first, len(output))
        assert memory.entries == ref.entries <= capacity
    contexts = {tuple(o[s : s + n]) for o in outputs for n in (1, 2, 3) for s in range(len(o) - n + 1)}
    for context in contexts:
        buffer = np.asarray(context, dtype=np.int32)
        i = memory_slot(memory, buffer)
        got = None if i < 0 else (int(memory.vals[i, 1]), int(memory.vals[i, 2]), int(memory.vals[i, 0]))
        assert got == ref.predict(list(context)), context


def memory_slot(memory: NgramMemory, context: np.ndarray) -> int:
    from specdraft.drafters.memory import find_context

    return find_context(memory.keys, context, 0, len(context))


# -- edge cases ----------------------------------------------------------------------------------
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


def test_long_request_grows_its_buffers_and_keeps_drafting_like_the_reference():
    rng = np.random.default_rng(3)
    drafter, ref = NgramDrafter(k=4), RefDrafter(k=4)
    stream = np.tile(rng.integers(0, 40, size=300), 8)
    stream[rng.integers(0, len(stream), size=200)] = rng.integers(0, 40, size=200)  # copies with edits
    drafter.begin("r", stream[:10].tolist(), SamplingParams(max_tokens=1))
    ref.begin("r", stream[:10].tolist())
    slot = drafter._slot_of["r"]
    pos, growths, table = 10, 0, drafter._tables[slot]
    while pos < len(stream) - 10:
        [draft] = drafter.propose(["r"], [4])
        expected = ref.propose("r", 4) if pos % 20 < 4 else draft.token_ids.tolist()  # the reference is slow
        assert draft.token_ids.tolist() == expected
        ref.last["r"] = draft.token_ids.tolist()
        accepted = 0
        while accepted < len(draft) and draft.token_ids[accepted] == stream[pos + accepted]:
            accepted += 1
        kept = stream[pos : pos + accepted + 1].tolist()
        drafter.accept("r", kept)
        ref.accept("r", kept)
        pos += len(kept)
        growths += drafter._tables[slot] is not table
        table = drafter._tables[slot]
    assert growths >= 5


def test_many_requests_and_slot_reuse():
    drafter = NgramDrafter(k=3)
    rng = np.random.default_rng(1)
    refs = RefDrafter(k=3)
    for round_ in range(3):
        ids = [f"{round_}-{i}" for i in range(20)]
        for rid in ids:
            prompt = rng.integers(0, 4, size=rng.integers(0, 50)).tolist()
            drafter.begin(rid, prompt, SamplingParams())
            refs.begin(rid, prompt)
        for _ in range(5):
            drafts = drafter.propose(ids, [3] * len(ids))
            for rid, draft in zip(ids, drafts):
                assert draft.token_ids.tolist() == refs.propose(rid, 3, batch=len(ids))
                kept = draft.token_ids.tolist()[:1] + [int(rng.integers(0, 4))]
                drafter.accept(rid, kept)
                refs.accept(rid, kept)
        for rid in ids:
            drafter.end(rid)
            refs.end(rid)
    assert len(drafter._tokens) == 20  # slots are reused


# -- isolation and the cross-request memory ------------------------------------------------------
SECRET = [900, 901, 902, 903, 904, 905]


def run_two_requests(drafter) -> list[int]:
    """Request A outputs SECRET after a shared context; B then sees that context. Returns B's drafts."""
    shared = [1, 2, 3, 4]
    drafter.begin("a", shared, SamplingParams())
    drafter.propose(["a"], [5])
    drafter.accept("a", SECRET)
    drafter.end("a")
    drafter.begin("b", [7, 8] + shared, SamplingParams())
    seen = []
    for _ in range(4):
        [draft] = drafter.propose(["b"], [5])
        seen += draft.token_ids.tolist()
        drafter.accept("b", draft.token_ids.tolist() + [5])
    return seen


def test_without_memory_no_request_sees_another_requests_tokens():
    seen = run_two_requests(create_drafter("ngram", k=5))
    assert not set(seen) & set(SECRET)


def test_with_memory_a_later_request_drafts_earlier_outputs():
    drafter = create_drafter("ngram", k=5, memory=True)
    assert drafter.memory is not None
    assert set(run_two_requests(drafter)) & set(SECRET)  # the control: the leak test above can fail


def test_memory_save_and_load(tmp_path):
    path = tmp_path / "memory.npz"
    drafter = create_drafter("ngram", k=5, memory_path=str(path))
    run_two_requests(drafter)
    drafter.memory.save(path)
    loaded = create_drafter("ngram", k=5, memory_path=str(path))
    assert loaded.memory.entries == drafter.memory.entries > 0
    assert np.array_equal(loaded.memory.keys, drafter.memory.keys)
    assert set(run_two_requests(loaded)) & set(SECRET)


def test_memory_rejects_other_format(tmp_path):
    path = tmp_path / "memory.npz"
    NgramMemory(capacity=16).save(path)
    with np.load(path) as data:
        arrays = dict(data)
    arrays["config"][0] = 99
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ValueError, match="memory format 99"):
        NgramMemory.load(path)


def test_memory_stays_under_its_cap():
    memory = NgramMemory(capacity=64, max_n=4)
    rng = np.random.default_rng(2)
    for _ in range(50):
        memory.learn(rng.integers(0, 1000, size=100).astype(np.int32), 0, 100)
        assert memory.entries <= 64


# -- registry and validation ---------------------------------------------------------------------
def test_registry_builds_the_indexed_drafter_with_its_options():
    drafter = create_drafter("ngram", k=7, max_n=5, copy_min_n=2, min_confidence=0.25, adaptive=False)
    assert isinstance(drafter, NgramDrafter) and isinstance(drafter, Drafter)
    assert (drafter.k, drafter.max_n, drafter.copy_min_n, drafter.min_confidence) == (7, 5, 2, 0.25)
    assert drafter.memory is None and not drafter.adaptive


def test_registry_takes_eos_from_the_target():
    class Target:
        eos_token_ids = (2, 0)

    assert create_drafter("ngram", target=Target()).eos.tolist() == [0, 2]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_n": 1}, "max_n must be >= 2, got 1"),
        ({"copy_min_n": 0}, "copy_min_n must be >= 1, got 0"),
        ({"min_confidence": 1.5}, r"min_confidence must be in \[0, 1\], got 1.5"),
    ],
)
def test_invalid_options(options, message):
    with pytest.raises(ValueError, match=message):
        NgramDrafter(**options)


def test_end_is_idempotent_and_forgets():
    drafter = NgramDrafter()
    drafter.begin("r", [1, 2, 1], SamplingParams())
    drafter.end("r")
    drafter.end("r")
    with pytest.raises(KeyError):
        drafter.propose(["r"], [3])


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
