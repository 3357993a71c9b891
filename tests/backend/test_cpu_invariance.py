"""One arithmetic per token on CPU: the embedded model's compiled step (native weights) gives a token
the same logits and keys and values in a plain step and a verify pass of any width (at any number
of keys: attention splits a token's keys in spans at fixed offsets), so a speculative request's
logprobs equal a plain one's bitwise; with invariant prefill (`SPECDRAFT_INVARIANT_PREFILL=1`:
prefill chunks as calls of 32 tokens) a prefill chunk's too, so a prefix-cache hit's equal a cold
request's; by default (BLAS prefill) a chunk longer than `SHORT_PASS` does not (the negative control),
a shorter one does (it runs the stack). The Triton kernels' side
(CUDA) is `tests/backend/test_invariance.py`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft import LLM, SamplingParams, SpeculationParams
from specdraft.backend.numba_layers import stack as numba_layers
from tests.helpers.tiny import feed

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("invariant_prefill", [True, False])
def test_prefill_chunks_and_verify_passes_equal_token_by_token(embedded, monkeypatch, invariant_prefill):
    monkeypatch.setattr(numba_layers, "LONG_PASSES", invariant_prefill)
    rng = np.random.default_rng(0)
    prompt, extra = rng.integers(0, 49152, size=150), rng.integers(0, 49152, size=18)  # past 128 keys
    reference = feed(embedded.model, prompt, extra, 1, [1] * len(extra))  # token by token
    for chunk, widths in [(150, [3, 5, 4, 6]), (64, [6, 6, 6]), (37, [2] * 9)]:
        logits, cache = feed(embedded.model, prompt, extra, chunk, widths)
        where = f"chunks of {chunk}, passes {widths}"
        if not invariant_prefill and chunk > numba_layers.SHORT_PASS:  # BLAS's chunks round otherwise, and all after them
            assert not torch.equal(cache[:, :, :, : len(prompt)], reference[1][:, :, :, : len(prompt)]), where
            continue
        assert torch.equal(cache, reference[1]), f"keys/values differ: {where}"
        differ = (logits != reference[0]).any(-1).nonzero().flatten().tolist()
        assert not differ, f"logits differ at tokens {differ[:5]}: {where}"


def test_verify_passes_equal_single_steps_after_any_prefill(embedded):
    """With the default (BLAS) prefill: after the same prefill, passes of 2..6 tokens give the logits
    and entries one-token steps give, past 128 keys."""
    rng = np.random.default_rng(1)
    prompt, extra = rng.integers(0, 49152, size=140), rng.integers(0, 49152, size=18)
    reference = feed(embedded.model, prompt, extra, 512, [1] * len(extra))
    for widths in ([3, 5, 4, 6], [6, 6, 6], [2] * 9):
        logits, cache = feed(embedded.model, prompt, extra, 512, widths)
        assert torch.equal(cache, reference[1]), f"keys/values differ: passes {widths}"
        assert torch.equal(logits, reference[0]), f"logits differ: passes {widths}"


def logprob_bits(output) -> np.ndarray:
    return np.array([[e.logprob, *(lp for _, lp in e.top)] for e in output.logprobs], dtype=np.float32).view(np.int32)


def test_logprobs_of_speculative_and_cached_requests_are_plain_cold_ones_bitwise(embedded, monkeypatch):
    """Through `LLM` on the embedded model: `ngram` (fixed policy) against `none`, and, with invariant
    prefill, the second turn of a conversation from the prefix cache against the same turn under a
    fresh `cache_salt`."""
    llm = LLM(embedded, drafters=["none", "ngram"], k=5, max_batch=2, calibrate=False)
    code = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    messages = [{"role": "user", "content": f"Repeat this code exactly, then add a docstring to each function:\n{code * 3}"}]
    [plain] = llm.chat(messages, SamplingParams(max_tokens=48, logprobs=3, cache_salt="a"), SpeculationParams("none"))
    [speculative] = llm.chat(messages, SamplingParams(max_tokens=48, logprobs=3, cache_salt="b"),
                             SpeculationParams("ngram", policy="fixed"))
    assert speculative.metrics.accepted_tokens > 0 and len(plain.prompt_token_ids) > 128
    assert speculative.token_ids == plain.token_ids
    assert np.array_equal(logprob_bits(speculative), logprob_bits(plain))
    monkeypatch.setattr(numba_layers, "LONG_PASSES", True)
    follow = messages + [{"role": "assistant", "content": plain.text}, {"role": "user", "content": "Now in one line."}]
    [first] = llm.chat(follow, SamplingParams(max_tokens=8, cache_salt="c"), SpeculationParams("none"))  # fills the cache
    turn = follow + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Thanks."}]
    [warm] = llm.chat(turn, SamplingParams(max_tokens=24, logprobs=3, cache_salt="c"), SpeculationParams("none"))
    [cold] = llm.chat(turn, SamplingParams(max_tokens=24, logprobs=3, cache_salt="fresh"), SpeculationParams("none"))
    assert warm.metrics.cached_tokens > 100 and cold.metrics.cached_tokens == 0
    assert warm.token_ids == cold.token_ids
    assert np.array_equal(logprob_bits(warm), logprob_bits(cold))
