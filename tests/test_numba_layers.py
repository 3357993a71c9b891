"""Numba's CPU layers (`specdraft.backend.numba_layers`, float32 weights): logits equal the eager
layers' for every token count they take, with biases, across a cache that grows mid-stream; in a
packed batch (rows feeding different token counts) every real token's logits and every committed
cache entry equal the eager pass's; larger passes run the eager layers; they apply to plain float32
layers only; their threads follow torch's."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from specdraft.backend import RowModel
from specdraft.backend.fused import FusedLayers
from specdraft.backend.linear import use_int8_linears
from specdraft.backend.numba_layers import MAX_TOKENS, NumbaLayers
from tests.conftest import TINY_VOCAB, make_tiny_model, row_passes

ATOL = 2e-5  # the same sums in another order


def test_passes_equal_the_eager_layers_for_every_token_count_as_the_cache_grows():
    model = make_tiny_model(seed=11, dtype=torch.float32, layers=2, attention_bias=True, mlp_bias=True)
    # 60 prompt tokens, then passes past the cache's first 64 and 128 positions (it grows twice).
    counts = [1, 2, 3, 4, 5, 6, 7, 8, 1, MAX_TOKENS, MAX_TOKENS + 3, 1, 5, 2]
    numba_rows = RowModel(model, fused=True)
    assert isinstance(numba_rows._own.fused, NumbaLayers)
    prompt = list(range(1, 61))
    generations: list[int] = []
    reference = row_passes(RowModel(model), prompt, counts)
    for n, got, want in zip(counts, row_passes(numba_rows, prompt, counts, generations), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert len(set(generations[:-4])) >= 2  # the cache grew while numba's passes ran


def test_a_packed_batch_equals_the_eager_pass_token_by_token_and_in_the_cache():
    model = make_tiny_model(seed=12, dtype=torch.float32, layers=2)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, TINY_VOCAB, size=n).tolist() for n in (7, 20, 3)]
    counts = [3, 1, 2]  # rows feed 3, 1 and 2 real tokens of a [3, 3] pass: packed, padding not computed
    ids = rng.integers(0, TINY_VOCAB, size=(3, 3))
    results = []
    for fused in (True, False):
        rows = RowModel(model, fused=fused)
        for i, prompt in enumerate(prompts):
            rows.add(f"r{i}", active=True)
            rows.prefill(f"r{i}", prompt)
        logits = rows.forward(rows.active_window, ids, counts=counts).clone()
        rows.commit(rows.active_window, counts)
        entries = [rows.cache.entries(layer, slot) for layer in range(2) for slot in range(3)]
        results.append((logits, entries, type(rows._own.fused)))
    (got, got_entries, kind), (want, want_entries, _) = results
    assert kind is NumbaLayers
    for b, n in enumerate(counts):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=0, atol=ATOL)
        assert torch.equal(got[b, n:], torch.zeros_like(got[b, n:]))  # padding: not computed
    for (k, v), (k_want, v_want) in zip(got_entries, want_entries):
        torch.testing.assert_close(k, k_want, rtol=0, atol=1e-5)
        torch.testing.assert_close(v, v_want, rtol=0, atol=1e-5)


def test_a_greedy_continuation_is_the_eager_one():
    model = make_tiny_model(seed=13, dtype=torch.float32, layers=2)
    continuations = []
    for fused in (True, False):
        rows = RowModel(model, fused=fused)
        rows.add("r", active=True)
        token = int(rows.prefill("r", list(range(3, 40))).argmax())
        out = [token]
        for _ in range(40):
            token = int(rows.forward(rows.active_window, [[token]])[0, -1].argmax())
            rows.commit(rows.active_window, [1])
            out.append(token)
        continuations.append(out)
    assert continuations[0] == continuations[1]


def test_numba_layers_apply_to_plain_float32_layers_only():
    model = make_tiny_model(seed=14, dtype=torch.float32, layers=1)
    layers = list(model.model.layers)
    assert NumbaLayers.applies(model, layers, torch.float32)
    assert not NumbaLayers.applies(model, layers, torch.bfloat16)  # other activations: inductor's parts
    model.config.hidden_act = "gelu"
    assert not NumbaLayers.applies(model, layers, torch.float32)
    model.config.hidden_act = "silu"
    use_int8_linears(model)
    assert not NumbaLayers.applies(model, layers, torch.float32)  # an int8 draft copy
    rows = RowModel(model, dtype=torch.bfloat16, fused=True)
    assert isinstance(rows._own.fused, FusedLayers)
    assert NumbaLayers.takes(MAX_TOKENS) and not NumbaLayers.takes(MAX_TOKENS + 1)
    half = make_tiny_model(seed=14, dtype=torch.bfloat16, layers=1)
    assert not NumbaLayers.applies(half, list(half.model.layers), torch.float32)  # bf16 weights


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one numba thread only")
def test_threads_follow_torch():
    model = make_tiny_model(seed=15, dtype=torch.float32, layers=1)
    rows = RowModel(model, fused=True)
    rows.add("r", active=True)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            rows.forward(rows.active_window, [[4]])
            assert numba.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
