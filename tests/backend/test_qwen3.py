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

import pytest
import torch

from specdraft.backend import forward
from specdraft.backend.family import family_of
from specdraft.backend.numba_layers import MAX_TOKENS
from specdraft.backend.triton_layers import unavailable
from tests.helpers.passes import PROMPTS, pass_logits, speculative_and_plain
from tests.helpers.families import make_tiny_qwen3
from tests.helpers.family_checks import (greedy_equals_plain_and_hugging_face, inductor_equals_eager,
                                         numba_equals_eager, own_forward_equals_stock,
                                         verify_passes_equal_plain_steps)
from tests.helpers.tiny import hf_greedy

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
    own_forward_equals_stock(make_tiny_qwen3(heads, kv_heads, head_dim, seed=3, dtype=dtype), atol, rows=3)


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_numba_passes_equal_the_eager_layers_for_every_token_count(heads, kv_heads, head_dim):
    numba_equals_eager(make_tiny_qwen3(heads, kv_heads, head_dim, seed=11), atol=5e-5)


def test_inductors_parts_equal_the_eager_layers(monkeypatch):
    inductor_equals_eager(make_tiny_qwen3(seed=13), list(range(1, 21)), monkeypatch)


def test_the_triton_kernels_refuse_q_k_norms_by_name():
    """(Under Triton's interpreter, as the test suite runs on CPU: every other check passes.)"""
    pytest.importorskip("triton")
    model = make_tiny_qwen3(layers=1)
    why = unavailable(model, list(model.model.layers), torch.float32, family_of(model.config))
    assert why == "the kernels have no per-head q/k norms (Qwen3's) yet"


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise(heads, kv_heads, head_dim):
    verify_passes_equal_plain_steps(make_tiny_qwen3(heads, kv_heads, head_dim, seed=21))


@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES, ids=IDS)
def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face(heads, kv_heads, head_dim):
    greedy_equals_plain_and_hugging_face(make_tiny_qwen3(heads, kv_heads, head_dim, seed=5), PROMPTS)


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
