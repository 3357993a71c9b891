"""The whole `ngram` drafter against its plain reference (copy, chain, EOS, adaptive length, the
cross-request memory) on random token streams grown through many `accept` calls, for several requests
at once; a long request grows its buffers and keeps drafting as the reference does; many requests
reuse slots."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.drafters import Drafter
from specdraft.drafters.memory import NgramMemory
from specdraft.drafters.ngram import NgramDrafter
from specdraft.params import SamplingParams
from tests.helpers.ngram_reference import EXAMPLES, RefDrafter, RefMemory, vocab_sizes


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
