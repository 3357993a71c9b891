"""Logprobs are bitwise a plain request's: a speculative request's (its tokens verified several a
pass) and a prefix-cache hit's (its prompt's entries reused, a short last prefill chunk) equal a plain
cold request's, bit for bit, where the target's kernels are batch-invariant (the Triton kernels, in
bf16; see tests/backend/test_invariance.py for how they run on CPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.helpers.tiny import TEST_DEVICE, ScriptedDrafter, ToyTokenizer, make_tiny_model, oracle_script

assert TEST_DEVICE.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest on CPU
pytest.importorskip("triton")

from specdraft.drafters import create_drafter  # noqa: E402
from specdraft.engine import Engine  # noqa: E402
from specdraft.params import SamplingParams  # noqa: E402
from specdraft.results import TokenLogprob  # noqa: E402
from specdraft.verifier import Verifier  # noqa: E402

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
TOP = 3


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(dtype=torch.bfloat16, layers=2)


def engine(model, drafters, prefix_cache_bytes: int = 0) -> Engine:
    verifier = Verifier(model, kernels="triton", prefix_cache_bytes=prefix_cache_bytes)
    return Engine(verifier, drafters, ToyTokenizer(), (), 64, k=4, policy="fixed", calibrate=False)


def bits(entries: list[TokenLogprob]) -> np.ndarray:
    """Every value of the entries as float32 bits: [tokens, 1 + TOP]."""
    return np.array([[e.logprob, *(lp for _, lp in e.top)] for e in entries], dtype=np.float32).view(np.int32)


def assert_bitwise(got: list[TokenLogprob], want: list[TokenLogprob]) -> None:
    assert [(e.token, [t for t, _ in e.top]) for e in got] == [(e.token, [t for t, _ in e.top]) for e in want]
    differ = np.flatnonzero((bits(got) != bits(want)).any(-1))
    assert not len(differ), f"logprobs differ at tokens {differ.tolist()}"


def test_a_speculative_requests_logprobs_are_a_plain_ones_bitwise(model):
    params = SamplingParams(max_tokens=12, logprobs=TOP)
    [plain] = engine(model, {"none": create_drafter("none")}).run([(PROMPT, params)])
    # Drafts of the plain continuation with every third token wrong: passes of 2..5 tokens.
    oracle = ScriptedDrafter(oracle_script({tuple(PROMPT): plain.token_ids}, lambda s, i: i % 3 == 2))
    [speculative] = engine(model, {"oracle": oracle}).run([(PROMPT, params)])
    assert speculative.metrics.accepted_tokens >= 4  # several tokens a pass
    assert speculative.token_ids == plain.token_ids
    assert_bitwise(speculative.logprobs, plain.logprobs)


def test_a_prefix_cache_hits_logprobs_are_a_cold_ones_bitwise(model):
    """The second turn of a conversation under its salt (its history's entries reused) and under a
    fresh salt (prefilled from scratch in one chunk)."""
    served = engine(model, {"none": create_drafter("none")}, prefix_cache_bytes=1 << 20)
    [first] = served.run([(PROMPT, SamplingParams(max_tokens=6, cache_salt="chat"))])
    turn = PROMPT + first.token_ids + [7, 8, 9]
    [warm] = served.run([(turn, SamplingParams(max_tokens=6, logprobs=TOP, cache_salt="chat"))])
    [cold] = served.run([(turn, SamplingParams(max_tokens=6, logprobs=TOP, cache_salt="fresh"))])
    assert warm.metrics.cached_tokens == len(PROMPT) + len(first.token_ids) - 1 and cold.metrics.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert_bitwise(warm.logprobs, cold.logprobs)
