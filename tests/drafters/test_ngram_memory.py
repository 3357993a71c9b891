"""The `ngram` drafter's cross-request memory (`specdraft.drafters.memory`): its tables against the
plain reference's learn and decay rules; without it no request sees another's tokens, with it a later
request drafts an earlier one's output (the control); it saves and loads, refuses another format, and
stays under its cap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.drafters import create_drafter
from specdraft.drafters.memory import NgramMemory
from specdraft.params import SamplingParams
from tests.helpers.ngram_reference import RefMemory


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
