"""Qwen3 in our forward, a family as a row (`specdraft.backend.family.FAMILIES`): per-head q/k norms
(`Family.qk_norm`), no biases, heads wider than hidden / heads. Tiny random Qwen3 models built
in-process (4 query heads over 2 kv heads of 64 at hidden 128; 8 over 1 of 32): our forward gives
the stock model's logits across rows and packed passes; numba's compiled layers and inductor's
parts equal the eager ones for every token count; the compiled CPU step gives a token bitwise the
same logits, keys and values in a plain step and in verify passes of any width; greedy speculative
output equals plain greedy and Hugging Face `generate`'s. The Triton kernels refuse it by name. A
tiny Qwen3 written as a GGUF as llama.cpp writes one (its q/k norms float32, `attention.key_length`
its head size, which transformers' GGUF config leaves at 128) loads natively through specdraft and
gives the dense logits bitwise in the float32 arithmetic, and speculative == plain in the int8 one."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from specdraft.backend import RowModel, forward
from specdraft.backend.family import family_of
from specdraft.backend.inductor import InductorLayers
from specdraft.backend.numba_layers import MAX_TOKENS, NumbaLayers
from specdraft.backend.triton_layers import unavailable
from tests.helpers.passes import PROMPTS, pass_logits, speculative_and_plain, stock_logits
from tests.helpers.qwen2 import make_tiny_qwen3
from tests.helpers.tiny import TINY_VOCAB, feed, hf_greedy, row_passes

SHAPES = [(4, 2, 64), (8, 1, 32)]  # (heads, kv heads, head_dim): 256 and 256 wide at hidden 128
IDS = ["4x64", "8x32"]


def test_a_qwen3_config_gives_q_k_norms_and_no_biases():
    family = family_of(make_tiny_qwen3(layers=1).config)
    assert (family.model_type, family.shape, family.qk_norm) == ("qwen3", (4, 2, 64), True)
    assert (family.qkv_bias, family.out_bias, family.mlp_bias, family.gguf_interleaved_qk) == (False,) * 4
    assert family_of(make_tiny_qwen3(layers=1, attention_bias=True).config).qkv_bias
    assert not family.tied_head


def test_our_forward_takes_a_qwen3_only_with_its_q_k_norms():
    model = make_tiny_qwen3(layers=1)
    assert forward.supports(model)
    del model.model.layers[0].self_attn.k_norm
    assert not forward.supports(model)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-5), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(heads, kv_heads, head_dim, dtype, atol):
    """(float64 to 1e-5 only: Qwen3's norms compute in float32 whatever the model's dtype.)"""
    model = make_tiny_qwen3(heads, kv_heads, head_dim, seed=3, dtype=dtype)
    rows = RowModel(model, prefill_chunk=7)
    assert rows.own_forward and rows.family.qk_norm
    rng = random.Random(0)
    contexts = {f"r{i}": [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(2, 40))] for i in range(3)}
    for row_id, ids in contexts.items():
        rows.add(row_id, active=True)
        torch.testing.assert_close(rows.prefill(row_id, ids), stock_logits(model, ids)[-1], rtol=0, atol=atol)
    counts = [1, 4, 3]
    inputs = np.array([[rng.randrange(TINY_VOCAB) for _ in range(4)] for _ in counts], dtype=np.int64)
    flat = np.concatenate([inputs[b, :n] for b, n in enumerate(counts)])
    logits = rows.packed_pass(rows.active_window, flat, np.array(counts)).logits
    starts = np.cumsum([0] + counts)
    for b, ids in enumerate(contexts.values()):
        real = inputs[b, : counts[b]].tolist()
        torch.testing.assert_close(logits[starts[b] : starts[b + 1]], stock_logits(model, ids + real)[len(ids):],
                                   rtol=0, atol=atol)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_numba_passes_equal_the_eager_layers_for_every_token_count(heads, kv_heads, head_dim):
    model = make_tiny_qwen3(heads, kv_heads, head_dim, seed=11)
    counts = [1, 2, 3, 6, 7, 1, MAX_TOKENS, MAX_TOKENS + 3, 1, 5]
    compiled = RowModel(model, compiled=True)
    assert isinstance(compiled.compiled_layers, NumbaLayers)
    reference = row_passes(RowModel(model), list(range(1, 61)), counts)
    for n, got, want in zip(counts, row_passes(compiled, list(range(1, 61)), counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_inductors_parts_equal_the_eager_layers(monkeypatch):
    """Float32 layers take inductor's parts here (numba's kept off), as int8 and bf16 ones do."""
    monkeypatch.setattr(NumbaLayers, "applies", staticmethod(lambda *args: False))
    model = make_tiny_qwen3(seed=13)
    compiled = RowModel(model, compiled=True)
    assert isinstance(compiled.compiled_layers, InductorLayers)
    counts = [1, 3, 8, 2]
    reference = row_passes(RowModel(model), list(range(1, 21)), counts)
    for n, got, want in zip(counts, row_passes(compiled, list(range(1, 21)), counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert compiled.compiled_layers.failed is None


def test_the_triton_kernels_refuse_q_k_norms_by_name():
    """(Under Triton's interpreter, as the test suite runs on CPU: every other check passes.)"""
    pytest.importorskip("triton")
    model = make_tiny_qwen3(layers=1)
    why = unavailable(model, list(model.model.layers), torch.float32, family_of(model.config))
    assert why == "the kernels have no per-head q/k norms (Qwen3's) yet"


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise(heads, kv_heads, head_dim):
    model = make_tiny_qwen3(heads, kv_heads, head_dim, seed=21)
    rng = np.random.default_rng(1)
    prompt, extra = rng.integers(0, TINY_VOCAB, size=140), rng.integers(0, TINY_VOCAB, size=18)
    reference = feed(model, prompt, extra, len(prompt), [1] * len(extra))
    for widths in ([3, 5, 4, 6], [6, 6, 6], [2] * 9):
        logits, cache = feed(model, prompt, extra, len(prompt), widths)
        assert torch.equal(cache, reference[1]), f"keys/values differ: passes {widths}"
        assert torch.equal(logits, reference[0]), f"logits differ: passes {widths}"


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face(heads, kv_heads, head_dim):
    model = make_tiny_qwen3(heads, kv_heads, head_dim, seed=5)
    speculative, plain, accepted = speculative_and_plain(model, PROMPTS, 40)
    assert speculative == plain and accepted > 0
    assert plain == [hf_greedy(model, p, 40) for p in PROMPTS]


# -- a tiny Qwen3 GGUF, loaded by path -----------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_file(tmp_path_factory):
    """(path, dense): a tiny Qwen3's GGUF (Q4_1 projections, Q8_0 embedding and head; heads of 64 at
    hidden 128) and transformers' own model of that file."""
    from transformers import AutoModelForCausalLM

    from specdraft.models.gguf_cache import gguf_config
    from tests.helpers.gguf_files import write_model_gguf

    path = write_model_gguf(make_tiny_qwen3(4, 2, 64, seed=31, sharpen=12.0),
                            tmp_path_factory.mktemp("gguf") / "tiny-qwen3.gguf")
    dense = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 config=gguf_config(path)).eval()
    return path, dense


def test_a_tiny_qwen3_gguf_loads_natively_with_its_head_size(qwen3_file):
    from specdraft.backend import native as blocks
    from specdraft.models import load_model

    path, dense = qwen3_file
    assert dense.config.head_dim == 64  # transformers alone would say 128
    loaded = load_model(str(path), weights="native", arithmetic="float32")
    attention = loaded.model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, blocks.BlockLinear) and attention.q_proj.out_features == 4 * 64
    assert torch.equal(attention.q_norm.weight, dense.model.layers[0].self_attn.q_norm.weight)


def test_a_tiny_qwen3_gguf_gives_the_dense_logits_bitwise_in_float32(qwen3_file):
    from specdraft.models import load_model

    path, dense = qwen3_file
    native = load_model(str(path), weights="native", arithmetic="float32").model
    reference = copy.deepcopy(dense)
    from specdraft.backend.linear import use_few_rows_linears

    use_few_rows_linears(reference)  # as the loader builds a model on CPU
    prompt = list(range(1, 2 * MAX_TOKENS + 9))
    counts = [1, 6, MAX_TOKENS, 1, 3]
    for n, got, want in zip(["prefill", *counts], pass_logits(native, prompt, counts),
                            pass_logits(reference, prompt, counts)):
        assert torch.equal(got, want), f"a pass of {n}"
    assert speculative_and_plain(native, PROMPTS[:2], 24)[1] == [hf_greedy(dense, p, 24) for p in PROMPTS[:2]]


def test_a_tiny_qwen3_gguf_in_the_int8_arithmetic_speculates_as_it_decodes(qwen3_file):
    from specdraft.models import load_model

    native = load_model(str(qwen3_file[0]), weights="native", arithmetic="int8").model
    speculative, plain, accepted = speculative_and_plain(native, PROMPTS, 32)
    assert speculative == plain and accepted > 0
