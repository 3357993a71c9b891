"""Numba's CPU layers (`specdraft.backend.numba_layers`, float32 or int8 weights): logits equal the
eager layers' for every token count they take, with biases, across a cache that grows mid-stream; in
a packed batch (rows feeding different token counts) every real token's logits and every committed
cache entry equal the eager pass's; larger passes run the eager layers; an int8 draft copy's passes
equal a float32 model holding its dequantised weights; they apply to plain float32 or all-int8
layers with float32 activations only; their threads follow torch's; building them moves the weights
onto huge pages once (same values, the model's modules share them, a tied embedding follows, int8
weights stay buffers) and list each layer's joined weights in step order (`projections`). The kernels alone: a projection equals a float64 product for every row and
token count (odd rows, biases, residuals, int8 weights with scales); attention over cache spans
joined after (one token's entries split among threads) equals a float64 softmax, spans with nothing
seen included, by numba's loops and by the compiled kernel (`attention.cpp`, bitwise the same on
each of its paths), for Llama's head shapes and Qwen2.5's (7 and 6 query heads per kv head, heads
of 64 and 128)."""

from __future__ import annotations

import contextlib

import numba
import numpy as np
import pytest
import torch

from specdraft.backend import PREFILL_CHUNK, RowModel
from specdraft.backend import native as blocks
from specdraft.backend.numba_layers import stack as numba_layers
from specdraft.backend.numba_layers.stack import SHORT_PASS
from specdraft.backend.inductor import InductorLayers
from specdraft.backend.cache import SPAN
from specdraft.backend.weight_only_int8 import WeightOnlyInt8Linear, use_weight_only_int8
from specdraft.backend.numba_layers import MAX_TOKENS, NO_KERNEL, NO_RESIDUAL, NumbaLayers, attend, project, read_parts, step_weights
from tests.helpers.tiny import TINY_VOCAB, make_tiny_model, row_passes

ATOL = 2e-5  # the same sums in another order


def test_passes_equal_the_eager_layers_for_every_token_count_as_the_cache_grows():
    model = make_tiny_model(seed=11, dtype=torch.float32, layers=2, attention_bias=True, mlp_bias=True)
    # 60 prompt tokens, then passes past the cache's first 64 and 128 positions (it grows twice).
    counts = [1, 2, 3, 4, 5, 6, 7, 8, 1, MAX_TOKENS, MAX_TOKENS + 3, 1, 5, 2]
    numba_rows = RowModel(model, compiled=True)
    assert isinstance(numba_rows.compiled_layers, NumbaLayers)
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
    for compiled in (True, False):
        rows = RowModel(model, compiled=compiled)
        for i, prompt in enumerate(prompts):
            rows.add(f"r{i}", active=True)
            rows.prefill(f"r{i}", prompt)
        flat = np.concatenate([ids[b, :n] for b, n in enumerate(counts)])
        logits = rows.packed_pass(rows.active_window, flat, np.array(counts)).logits.clone()  # [6, vocab]
        rows.commit(rows.active_window, counts)
        entries = [rows.cache.entries(layer, slot) for layer in range(2) for slot in range(3)]
        results.append((logits, entries, type(rows.compiled_layers)))
    (got, got_entries, kind), (want, want_entries, _) = results
    assert kind is NumbaLayers
    assert got.shape[0] == sum(counts)  # padding: not computed
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    for (k, v), (k_want, v_want) in zip(got_entries, want_entries):
        torch.testing.assert_close(k, k_want, rtol=0, atol=1e-5)
        torch.testing.assert_close(v, v_want, rtol=0, atol=1e-5)


def test_a_greedy_continuation_is_the_eager_one():
    model = make_tiny_model(seed=13, dtype=torch.float32, layers=2)
    continuations = []
    for compiled in (True, False):
        rows = RowModel(model, compiled=compiled)
        rows.add("r", active=True)
        token = int(rows.prefill("r", list(range(3, 40))).argmax())
        out = [token]
        for _ in range(40):
            token = int(rows.forward(rows.active_window, [[token]])[0, -1].argmax())
            rows.commit(rows.active_window, [1])
            out.append(token)
        continuations.append(out)
    assert continuations[0] == continuations[1]


def test_a_profile_names_the_stack_and_head_calls():
    """Under a torch profiler, the stack's and the head's calls carry their names; without one, no
    `record_function` is entered (it costs a step tens of microseconds)."""
    rows = RowModel(make_tiny_model(seed=13, dtype=torch.float32, layers=2), compiled=True)
    rows.add("r", active=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        rows.prefill("r", list(range(3, 12)))
    names = {event.name for event in profile.events()}
    assert {"specdraft::numba_stack", "specdraft::numba_head"} <= names
    assert isinstance(numba_layers._named("specdraft::numba_stack"), contextlib.nullcontext)


def test_numba_layers_apply_to_plain_float32_layers_only(monkeypatch):
    model = make_tiny_model(seed=14, dtype=torch.float32, layers=1)
    layers = list(model.model.layers)
    assert NumbaLayers.applies(model, layers, torch.float32)
    assert not NumbaLayers.applies(model, layers, torch.bfloat16)  # other activations: inductor's parts
    model.config.hidden_act = "gelu"
    assert not NumbaLayers.applies(model, layers, torch.float32)
    model.config.hidden_act = "silu"
    model.lm_head = WeightOnlyInt8Linear(model.lm_head)
    assert not NumbaLayers.applies(model, layers, torch.float32)  # float32 and int8 linears mixed
    use_weight_only_int8(model)
    assert NumbaLayers.applies(model, layers, torch.float32)  # an int8 draft copy
    compiled = RowModel(model, dtype=torch.float32, compiled=True).compiled_layers
    assert isinstance(compiled, NumbaLayers)
    rows = RowModel(model, dtype=torch.bfloat16, compiled=True)  # bf16 activations: inductor's parts
    assert isinstance(rows.compiled_layers, InductorLayers)
    monkeypatch.setattr(numba_layers, "LONG_PASSES", False)  # the default
    assert compiled.takes(MAX_TOKENS, MAX_TOKENS) and compiled.takes(SHORT_PASS, SHORT_PASS)  # a short prefill too
    assert not compiled.takes(SHORT_PASS + 1, SHORT_PASS + 1)  # a longer prefill: the eager layers (BLAS)
    assert compiled.takes(8 * MAX_TOKENS, MAX_TOKENS)  # a batch's verify pass, whatever its total: in calls of MAX_TOKENS
    monkeypatch.setattr(numba_layers, "LONG_PASSES", True)  # SPECDRAFT_INVARIANT_PREFILL=1
    assert compiled.takes(MAX_TOKENS, MAX_TOKENS) and compiled.takes(PREFILL_CHUNK, PREFILL_CHUNK)  # in calls of MAX_TOKENS
    half = make_tiny_model(seed=14, dtype=torch.bfloat16, layers=1)
    assert not NumbaLayers.applies(half, list(half.model.layers), torch.float32)  # bf16 weights


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one numba thread only")
def test_threads_follow_torch():
    model = make_tiny_model(seed=15, dtype=torch.float32, layers=1)
    rows = RowModel(model, compiled=True)
    rows.add("r", active=True)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            rows.forward(rows.active_window, [[4]])
            assert numba.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("out", [1, 5, 16, 17, 33])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("int8", [False, True])
def test_a_projection_equals_the_product_for_every_row_and_token_count(out, residual, int8):
    rng = np.random.default_rng(out)
    for n in range(1, 9):
        if int8:  # int8 weights, each row times its scale
            w = rng.integers(-127, 128, size=(out, 70)).astype(np.int8)
            scales = rng.uniform(0.001, 0.02, size=out).astype(np.float32)
            dequantised = w.astype(np.float64) * scales[:, None]
        else:
            w, scales = rng.standard_normal((out, 70), dtype=np.float32), np.zeros(0, np.float32)
            dequantised = w.astype(np.float64)
        b = rng.standard_normal(out, dtype=np.float32)
        x = rng.standard_normal((n, 70), dtype=np.float32)
        r = rng.standard_normal((n, out), dtype=np.float32) if residual else NO_RESIDUAL
        y = np.full((n, out), np.nan, np.float32)
        project((w, scales, b, -1), x, y, r, NO_KERNEL)  # numba's loops
        want = x.astype(np.float64) @ dequantised.T + b + (r if residual else 0)
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-4, err_msg=f"{n} tokens")
        if not int8:  # the compiled kernel, float32 rows as bytes
            project((w.view(np.uint8), scales, b, blocks.F32), x, y, r, blocks.kernel().calls())
            np.testing.assert_allclose(y, want, rtol=0, atol=1e-4, err_msg=f"{n} tokens, compiled kernel")


def test_an_int8_copy_passes_equal_a_float32_model_of_its_dequantised_weights():
    int8 = make_tiny_model(seed=17, dtype=torch.float32, layers=2, attention_bias=True)
    use_weight_only_int8(int8)
    dequantised = make_tiny_model(seed=17, dtype=torch.float32, layers=2, attention_bias=True)
    linears = {name: m for name, m in int8.named_modules() if isinstance(m, WeightOnlyInt8Linear)}
    with torch.no_grad():
        for name, m in dequantised.named_modules():
            if name in linears:
                m.weight.copy_(linears[name].weight.float() * linears[name].scales.float()[:, None])
    counts = [1, 2, 3, 6, 9, 1]
    prompt = list(range(5, 25))
    numba_rows = RowModel(int8, dtype=torch.float32, compiled=True)
    assert isinstance(numba_rows.compiled_layers, NumbaLayers)
    assert all(m.weight.dtype == torch.int8 and "weight" in m._buffers for m in linears.values())  # moved, still buffers
    for n, got, want in zip(counts, row_passes(numba_rows, prompt, counts), row_passes(RowModel(dequantised), prompt, counts)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4, msg=f"a pass of {n} tokens")


def attention_reference(q, keys, values, visible):
    """Float64 softmax attention: q [N, heads, d], keys/values [kv_heads, kv, d], visible [N, kv]."""
    heads, kv_heads = q.shape[1], keys.shape[0]
    scores = np.einsum("nhd,hkd->nhk", q, np.repeat(keys, heads // kv_heads, axis=0)) / np.sqrt(q.shape[2])
    scores = np.where(visible[:, None, :], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("nhk,hkd->nhd", weights, np.repeat(values, heads // kv_heads, axis=0))


ATTENTIONS = ("numba", *blocks.PATHS)  # numba's loops, and the compiled kernel's builds


def paged(cache: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A cache of rows [rows, kv_heads, capacity, head_dim] (capacity whole spans) as `attend` reads it:
    pages [1 + rows * spans, kv_heads, SPAN, head_dim] in a shuffled order after a NaN page 0, and the
    table [rows, spans] of each row's pages."""
    rows, kv_heads, capacity, head_dim = cache.shape
    spans = capacity // SPAN
    order = 1 + rng.permutation(rows * spans)  # [rows * spans]: where each (row, span) lies
    pages = np.full((1 + rows * spans, kv_heads, SPAN, head_dim), np.nan, np.float32)
    pages[order] = cache.reshape(rows, kv_heads, spans, SPAN, head_dim).transpose(0, 2, 1, 3, 4).reshape(-1, kv_heads,
                                                                                                         SPAN, head_dim)
    return pages, order.reshape(rows, spans).astype(np.int64)


def unpaged(pages: np.ndarray, table: np.ndarray) -> np.ndarray:
    """`paged`'s cache back: [rows, kv_heads, spans * SPAN, head_dim]."""
    rows = pages[table]  # [rows, spans, kv_heads, SPAN, head_dim]
    return rows.transpose(0, 2, 1, 3, 4).reshape(table.shape[0], pages.shape[1], -1, pages.shape[3])


def attention_kernel(name: str) -> int:
    """`attend`'s kernel argument for an implementation in `ATTENTIONS`."""
    return 0 if name == "numba" else blocks.kernel(name).attend_address


@pytest.mark.parametrize("implementation", ATTENTIONS)
@pytest.mark.parametrize("tokens, kv", [(1, 5), (1, 2 * SPAN), (1, 5 * SPAN + 7), (2, 5 * SPAN), (5, 3 * SPAN)])
def test_attention_over_joined_spans_equals_the_softmax(tokens, kv, implementation):
    """...and each token's output is the same bitwise when it is attended alone (spans at fixed offsets);
    cache slots no token sees (NaN here) are never read as numbers."""
    heads, kv_heads, head_dim = 4, 1, 16  # one kv head: one token's entries split into spans
    rng = np.random.default_rng(kv)
    capacity = -(-kv // SPAN) * SPAN + SPAN  # as the cache holds it: whole spans, one past those in use
    cache = rng.standard_normal((2, 1, kv_heads, capacity, head_dim), dtype=np.float32)  # keys, values; one row
    cache[:, :, :, kv:] = np.nan
    qkv = rng.standard_normal((tokens, (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    positions = np.arange(kv - tokens, kv)
    visible = np.zeros((tokens, kv), bool)
    for t, p in enumerate(positions):  # the first token sees only its last 10 entries: early spans see nothing
        visible[t, (p - 9 if t == 0 else 0) : p + 1] = True
    (keys, table), (values, _) = paged(cache[0], np.random.default_rng(1)), paged(cache[1], np.random.default_rng(1))
    kernel = attention_kernel(implementation)
    out = np.full((tokens, heads * head_dim), np.nan, np.float32)
    attend(qkv, np.zeros(tokens, np.int64), positions, visible, keys, values, table, heads, kv_heads, head_dim, out,
           kernel, 2)
    q = qkv[:, : heads * head_dim].reshape(tokens, heads, head_dim).astype(np.float64)
    rows_keys, rows_values = unpaged(keys, table), unpaged(values, table)
    want = attention_reference(q, rows_keys[0, :, :kv].astype(np.float64), rows_values[0, :, :kv].astype(np.float64),
                               visible)
    np.testing.assert_allclose(out.reshape(tokens, heads, head_dim), want, rtol=0, atol=1e-5)
    written = qkv[:, heads * head_dim :].reshape(tokens, 2, kv_heads, head_dim)
    np.testing.assert_array_equal(rows_keys[0][:, positions].transpose(1, 0, 2), written[:, 0])  # the new entries
    for t in range(tokens):
        alone = np.full((1, heads * head_dim), np.nan, np.float32)
        seen = visible[t : t + 1, : positions[t] + 1]  # as its own pass would see the cache
        attend(qkv[t : t + 1], np.zeros(1, np.int64), positions[t : t + 1], seen, keys, values, table, heads, kv_heads,
               head_dim, alone, kernel, 1)
        np.testing.assert_array_equal(alone[0], out[t])


@pytest.mark.compiles
@pytest.mark.parametrize("implementation", ATTENTIONS)
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(14, 2, 64), (12, 2, 128), (7, 1, 64)])
def test_attention_of_qwen2s_shapes_equals_the_softmax_and_alone_each_token_its_own(heads, kv_heads, head_dim,
                                                                                    implementation):
    """Qwen2.5's 7 and 6 query heads per kv head (more than a job's queries, `MAX_JOB_QUERIES`), heads
    of 64 and 128: each token's output within float rounding of a float64 softmax, and bitwise the
    same attended alone, by numba's loops and by each of the kernel's builds."""
    rng = np.random.default_rng(heads)
    kv, tokens = 2 * SPAN + 5, 6
    rows_keys, rows_values = (rng.standard_normal((1, kv_heads, 3 * SPAN, head_dim), dtype=np.float32) for _ in range(2))
    (keys, table), (values, _) = paged(rows_keys, np.random.default_rng(2)), paged(rows_values, np.random.default_rng(2))
    qkv = rng.standard_normal((tokens, (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    positions = np.arange(kv - tokens, kv)
    visible = np.arange(kv)[None, :] <= positions[:, None]
    kernel = attention_kernel(implementation)
    out = np.empty((tokens, heads * head_dim), np.float32)
    attend(qkv, np.zeros(tokens, np.int64), positions, visible, keys, values, table, heads, kv_heads, head_dim, out,
           kernel, 2)
    q = qkv[:, : heads * head_dim].reshape(tokens, heads, head_dim).astype(np.float64)
    rows_keys, rows_values = unpaged(keys, table), unpaged(values, table)
    want = attention_reference(q, rows_keys[0, :, :kv].astype(np.float64), rows_values[0, :, :kv].astype(np.float64),
                               visible)
    np.testing.assert_allclose(out.reshape(tokens, heads, head_dim), want, rtol=0, atol=1e-5)
    for t in range(tokens):
        alone = np.empty((1, heads * head_dim), np.float32)
        attend(qkv[t : t + 1], np.zeros(1, np.int64), positions[t : t + 1], visible[t : t + 1, : positions[t] + 1], keys,
               values, table, heads, kv_heads, head_dim, alone, kernel, 1)
        np.testing.assert_array_equal(alone[0], out[t])


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (8, 2, 128), (4, 4, 16), (14, 2, 64), (12, 2, 128),
                                                       (7, 1, 64)])
@pytest.mark.compiles
def test_the_attention_kernel_computes_bitwise_the_same_on_every_path(heads, kv_heads, head_dim):
    """The kernel's AVX-512 build, its AVX2 one and its portable loops (attention.cpp: one order of
    arithmetic) give bitwise the same outputs, whatever the threads its jobs are shared among: a
    batch of two rows with a token each and one row with four, grouped-query heads, a span partly seen."""
    rng = np.random.default_rng(head_dim)
    kv, capacity = SPAN + 37, 3 * SPAN
    (keys, table), (values, _) = (paged(rng.standard_normal((3, kv_heads, capacity, head_dim), dtype=np.float32),
                                        np.random.default_rng(3)) for _ in range(2))  # one shuffle for both
    rows, positions = np.array([0, 1, 2, 2, 2, 2]), np.array([20, kv - 1, kv - 4, kv - 3, kv - 2, kv - 1])
    visible = np.arange(kv)[None, :] <= positions[:, None]
    qkv = rng.standard_normal((len(rows), (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    outs = {}
    for path in blocks.PATHS:
        for threads in (1, 2, 3):
            k, v, out = keys.copy(), values.copy(), np.empty((len(rows), heads * head_dim), np.float32)
            attend(qkv, rows, positions, visible, k, v, table, heads, kv_heads, head_dim, out, attention_kernel(path),
                   threads)
            outs[path, threads] = out
    assert blocks.kernel("portable").code == "portable"
    for (path, threads), out in outs.items():
        np.testing.assert_array_equal(out, outs["native", 2], err_msg=f"{path}, {threads} threads")


def test_building_moves_the_weights_once_keeping_values_and_ties():
    model = make_tiny_model(seed=16, dtype=torch.float32, layers=2)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    prompt = list(range(2, 30))
    want = row_passes(RowModel(model), prompt, [1, 3])
    RowModel(model, compiled=True)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert model.lm_head.weight is model.model.embed_tokens.weight
    attention = model.model.layers[0].self_attn
    q, k, v = attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight
    assert k.data_ptr() == q.data_ptr() + q.numel() * 4 and v.data_ptr() == k.data_ptr() + k.numel() * 4  # joined
    moved = {name: p.data_ptr() for name, p in model.named_parameters()}
    again = RowModel(model, compiled=True)  # a second step over the same layers: nothing moves
    assert moved == {name: p.data_ptr() for name, p in model.named_parameters()}
    for got, ref in zip(row_passes(again, prompt, [1, 3]), want):  # the eager layers' logits, moved weights
        torch.testing.assert_close(got, ref, rtol=0, atol=ATOL)


def test_projections_are_each_layers_joined_weights_in_step_order_then_the_output_layer():
    model = make_tiny_model(seed=18, dtype=torch.float32, layers=2)
    RowModel(model, compiled=True)
    weights = read_parts(step_weights(model, list(model.model.layers)))
    assert len(weights) == 4 * 2 + 1
    for i, layer in enumerate(model.model.layers):
        a, mlp = layer.self_attn, layer.mlp
        expected = [torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), a.o_proj.weight,
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight]
        for got, want in zip(weights[4 * i : 4 * i + 4], expected):
            np.testing.assert_array_equal(got[0], want.detach().numpy())
    np.testing.assert_array_equal(weights[-1][0], model.lm_head.weight.detach().numpy())
