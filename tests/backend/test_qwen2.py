"""Qwen2 in our forward, a family as data (`specdraft.backend.family`): each config's description
(head counts and size, biases, tied head, rope base, norm epsilon, the GGUF's q/k order) read
from it, other models refused by name. Tiny random Qwen2 models built in-process (7 query heads
over 1 kv head of 64, 6 over 2 of 128, q/k/v biases, an untied output layer): our forward gives
the stock model's logits across rows and packed passes (float64 and float32, as for Llama), and
so do the Triton kernels (under Triton's interpreter on CPU);
numba's compiled layers equal the eager ones for every token count; the compiled CPU step gives a
token bitwise the same logits, keys and values in a plain step and in verify passes of any width;
greedy speculative output (ngram) equals plain greedy and Hugging Face `generate`'s. A tiny Qwen2
written as a GGUF as llama.cpp writes one (q/k rows as transformers holds them; Q4_1 q/k/o/gate/up,
Q8_0 v/down/head; biases float32) reads its blocks with their biases and gives the dense logits
bitwise in the float32 arithmetic, and speculative == plain in the int8 one. The real 0.5B's file
holds q and k in transformers' order (slow: it reads the cached file and its conversion)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft.backend import RowModel, forward
from specdraft.backend import native as blocks
from specdraft.backend.family import family_of, family_problem
from specdraft.backend.linear import use_few_rows_linears
from specdraft.backend.numba_layers import MAX_TOKENS
from tests.helpers.tiny import hf_greedy, make_tiny_model
from tests.helpers.passes import PROMPTS, pass_logits, speculative_and_plain, stock_logits
from tests.helpers.families import make_tiny_qwen2
from tests.helpers.family_checks import (greedy_equals_plain_and_hugging_face, numba_equals_eager,
                                         own_forward_equals_stock, verify_passes_equal_plain_steps)

SHAPES = [(7, 1, 64), (6, 2, 128)]  # (heads, kv heads, head_dim): the 0.5B's 7 per kv head, the 1.5B's 6 of 128
IDS = ["7x64", "6x128"]


# -- the description ---------------------------------------------------------------------------------


def test_each_config_gives_its_familys_description_and_other_models_are_refused_by_name():
    from transformers import GemmaConfig, Qwen2Config

    qwen = family_of(make_tiny_qwen2(6, 2, 128).config)
    assert (qwen.model_type, qwen.shape, qwen.group) == ("qwen2", (6, 2, 128), 3)
    assert (qwen.qkv_bias, qwen.out_bias, qwen.mlp_bias, qwen.tied_head) == (True, False, False, False)
    assert (qwen.rope_theta, qwen.norm_eps, qwen.gguf_interleaved_qk) == (1e6, 1e-6, False)
    plain = family_of(make_tiny_model(layers=1).config)
    assert (plain.model_type, plain.shape, plain.qkv_bias, plain.gguf_interleaved_qk) == ("llama", (4, 2, 16), False, True)
    biased = family_of(make_tiny_model(layers=1, attention_bias=True, mlp_bias=True).config)
    assert (biased.qkv_bias, biased.out_bias, biased.mlp_bias) == (True, True, True)
    window = family_of(Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=16, max_window_layers=1))
    assert (window.window, window.sliding) == (16, (False, True))  # tests/backend/test_sliding_window.py
    assert family_of(Qwen2Config(num_hidden_layers=2, sliding_window=16)).window is None  # no window unless used
    assert "'gemma' is not a family our forward runs (llama, mistral, qwen2, qwen3, gemma3_text, phi3)" in family_problem(
        GemmaConfig(num_hidden_layers=1))


def test_our_forward_takes_a_qwen2_only_where_its_modules_match_the_description():
    model = make_tiny_qwen2(layers=1)
    assert forward.supports(model)
    model.model.layers[0].self_attn.k_proj.bias = None  # no longer what a Qwen2 is
    assert not forward.supports(model)


# -- tiny Qwen2 models in our forward ------------------------------------------------------------------


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(heads, kv_heads, head_dim, dtype, atol):
    model = make_tiny_qwen2(heads, kv_heads, head_dim, seed=3, dtype=dtype)
    assert RowModel(model).family.shape == (heads, kv_heads, head_dim)
    own_forward_equals_stock(model, atol)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_numba_passes_equal_the_eager_layers_for_every_token_count(heads, kv_heads, head_dim):
    numba_equals_eager(make_tiny_qwen2(heads, kv_heads, head_dim, seed=11), atol=2e-5)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_the_triton_kernels_give_the_stock_logits(heads, kv_heads, head_dim):
    """The batch-invariant Triton kernels (on CPU under Triton's interpreter), q/k/v joined with their biases."""
    pytest.importorskip("triton")
    model = make_tiny_qwen2(heads, kv_heads, head_dim, seed=3, layers=1)
    rows = RowModel(model, kernels="triton")
    assert rows.invariant_layers is not None
    rows.add("r", active=True)
    ids = list(range(1, 12))
    torch.testing.assert_close(rows.prefill("r", ids), stock_logits(model, ids)[-1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise(heads, kv_heads, head_dim):
    """Past 128 keys (attention in spans), by the compiled kernel's attention where it compiles."""
    verify_passes_equal_plain_steps(make_tiny_qwen2(heads, kv_heads, head_dim, seed=21))


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face(heads, kv_heads, head_dim):
    greedy_equals_plain_and_hugging_face(make_tiny_qwen2(heads, kv_heads, head_dim, seed=5, dtype=torch.float64),
                                         PROMPTS)


# -- a tiny Qwen2 GGUF -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_pair(tmp_path_factory):
    """(dense, native): a tiny float32 Qwen2 holding a GGUF's values (q/k/o/gate/up Q4_1; v, down and
    the output layer Q8_0, as the 0.5B's v and head are), and a copy reading the file's blocks."""
    from tests.helpers.gguf_files import write_gguf

    dense = make_tiny_qwen2(7, 1, 64, seed=31, sharpen=12.0)
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    write_gguf(dense, path, types={"attn_v": "Q8_0", "ffn_down": "Q8_0"})
    use_few_rows_linears(dense)  # as the loader builds a model on CPU
    native = copy.deepcopy(dense)
    assert blocks.use_gguf_blocks(native, path) == 2 + 7 * 2
    return dense, native


def test_a_tiny_qwen2_gguf_reads_its_blocks_with_their_biases(qwen_pair):
    dense, native = qwen_pair
    attention = native.model.layers[0].self_attn
    assert attention.q_proj.kind == blocks.Q4_1 and attention.v_proj.kind == blocks.Q8_0
    assert native.lm_head.kind == blocks.Q8_0 and native.lm_head.bias is None
    for name, module in native.named_modules():
        if isinstance(module, blocks.BlockLinear):
            want = dense.get_submodule(name)
            assert torch.equal(module.dense(), want.weight), name
            assert (module.bias is None) == (want.bias is None), name
            assert module.bias is None or torch.equal(module.bias, want.bias), name
    assert attention.q_proj.bias is not None and native.model.layers[0].self_attn.o_proj.bias is None


def test_a_q_k_v_group_of_two_kinds_is_read_as_blocks_of_each(qwen_pair):
    """q and k Q4_1, v Q8_0: the step reads two parts of blocks, side by side, never float32 rows."""
    from specdraft.backend.numba_layers import read_parts, step_weights

    _, native = qwen_pair
    weights = step_weights(native, list(native.model.layers), native=True)
    attention = native.model.layers[0].self_attn
    first, second = weights[0]
    assert (first[3], second[3]) == (blocks.Q4_1, blocks.Q8_0)
    assert first[2].shape[0] == attention.q_proj.out_features + attention.k_proj.out_features
    assert second[2].shape[0] == attention.v_proj.out_features
    assert all(part[3] != blocks.F32 for part in read_parts(weights))


def test_a_tiny_qwen2_gguf_gives_the_dense_logits_bitwise_in_float32(qwen_pair):
    dense, native = qwen_pair
    prompt = list(range(1, 2 * MAX_TOKENS + 9))  # a prefill chunk of 72 tokens
    counts = [1, 6, MAX_TOKENS, 1, 3]
    for n, got, want in zip(["prefill", *counts], pass_logits(native, prompt, counts), pass_logits(dense, prompt, counts)):
        assert torch.equal(got, want), f"a pass of {n}"
    assert speculative_and_plain(native, PROMPTS[:2], 24)[1] == [hf_greedy(dense, p, 24) for p in PROMPTS[:2]]


def test_a_tiny_qwen2_gguf_in_the_int8_arithmetic_speculates_as_it_decodes(qwen_pair):
    _, native = qwen_pair
    quantized = copy.deepcopy(native)
    assert blocks.use_arithmetic(quantized, "int8") == 2 * 7 + 1
    speculative, plain, accepted = speculative_and_plain(quantized, PROMPTS, 32)
    assert speculative == plain and accepted > 0


# -- the real 0.5B ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_real_05b_holds_q_and_k_in_transformers_order():
    """Its q and k (Q5_0) dequantised as they lie in the file are its conversion's weights: no rows
    to put back (`gguf_interleaved_qk` False), unlike a Llama file's."""
    gguf = pytest.importorskip("gguf")
    from safetensors import safe_open

    from specdraft.models.gguf_cache import gguf_cache_path
    from specdraft.params import cache_dir

    path = cache_dir() / "catalogue" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    converted = gguf_cache_path(path) / "model.safetensors" if path.is_file() else Path("absent")
    if not converted.is_file():
        pytest.skip("the 0.5B and its conversion are not cached here")
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    with safe_open(str(converted), framework="pt") as stored:
        for part, name in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
            t = tensors[f"blk.0.{part}.weight"]
            values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            assert np.array_equal(values, stored.get_tensor(f"model.layers.0.self_attn.{name}.weight").numpy()), part
