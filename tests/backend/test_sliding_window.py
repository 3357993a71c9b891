"""A sliding window as a family's data (`Family.window`, `Family.sliding`): a token of a layer that
slides sees itself and the `window - 1` entries before it, every entry kept in the cache (rollback
and the prefix cache unchanged). Tiny random models built in-process with a window of 16: a Mistral
(every layer slides) and a Qwen2 with use_sliding_window (its second layer slides, its first does
not); contexts several windows long. Our forward gives the stock model's logits across rows and
packed passes; numba's compiled layers and inductor's parts equal the eager ones; the compiled CPU
step gives a token bitwise the same logits, keys and values in a plain step and in verify passes
of any width (spans wholly outside every token's window are not read); greedy speculative output
equals plain greedy and Hugging Face `generate`'s (whose cache keeps the window only). The Triton
kernels refuse a window by name."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdraft.backend import RowModel
from specdraft.backend.family import family_of, family_problem
from specdraft.backend.inductor import InductorLayers
from specdraft.backend.numba_layers import MAX_TOKENS, NumbaLayers
from specdraft.backend.triton_layers import unavailable
from tests.helpers.passes import speculative_and_plain, stock_logits
from tests.helpers.qwen2 import make_tiny_qwen2
from tests.helpers.tiny import TINY_VOCAB, feed, hf_greedy, row_passes

WINDOW = 16


def make_tiny_mistral(seed: int = 0, dtype: torch.dtype = torch.float32, layers: int = 2):
    """A random Mistral (hidden 128, 4 heads over 2 of 32) whose every layer slides over 16 tokens."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=WINDOW, tie_word_embeddings=False)
    model = MistralForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # varied greedy continuations, not ties
    return model


def make_windowed_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random Qwen2 whose second layer slides over 16 tokens (max_window_layers 1), its first not."""
    return make_tiny_qwen2(4, 2, 32, seed=seed, dtype=dtype, use_sliding_window=True, sliding_window=WINDOW,
                           max_window_layers=1)


MODELS = {"mistral": make_tiny_mistral, "qwen2": make_windowed_qwen2}


def test_each_config_says_which_layers_slide():
    mistral = family_of(make_tiny_mistral(layers=3).config)
    assert (mistral.model_type, mistral.window, mistral.sliding) == ("mistral", WINDOW, (True, True, True))
    qwen = family_of(make_windowed_qwen2().config)
    assert (qwen.window, qwen.sliding, qwen.slides(0), qwen.slides(1)) == (WINDOW, (False, True), False, True)
    plain = family_of(make_tiny_qwen2(layers=1).config)
    assert (plain.window, plain.sliding, plain.slides(0)) == (None, (), False)
    chunked = make_tiny_mistral(layers=1).config
    chunked.layer_types = ["chunked_attention"]
    assert family_problem(chunked) == "layers of attention other than full or sliding: ['chunked_attention']"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-5), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(name, dtype, atol):
    """(float64 to 1e-5 only: the norms compute in float32 whatever the model's dtype.)"""
    model = MODELS[name](seed=3, dtype=dtype)
    rows = RowModel(model, prefill_chunk=7)
    assert rows.own_forward
    rng = random.Random(0)
    contexts = {f"r{i}": [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(2, 60))] for i in range(4)}
    for row_id, ids in contexts.items():
        rows.add(row_id, active=True)
        torch.testing.assert_close(rows.prefill(row_id, ids), stock_logits(model, ids)[-1], rtol=0, atol=atol)
    counts = [1, 4, 2, 3]
    inputs = np.array([[rng.randrange(TINY_VOCAB) for _ in range(4)] for _ in counts], dtype=np.int64)
    flat = np.concatenate([inputs[b, :n] for b, n in enumerate(counts)])
    logits = rows.packed_pass(rows.active_window, flat, np.array(counts)).logits
    starts = np.cumsum([0] + counts)
    for b, ids in enumerate(contexts.values()):
        real = inputs[b, : counts[b]].tolist()
        torch.testing.assert_close(logits[starts[b] : starts[b + 1]], stock_logits(model, ids + real)[len(ids):],
                                   rtol=0, atol=atol)


@pytest.mark.parametrize("name", MODELS)
def test_numba_passes_equal_the_eager_layers_for_every_token_count(name):
    model = MODELS[name](seed=11)
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
    model = make_windowed_qwen2(seed=13)
    compiled = RowModel(model, compiled=True)
    assert isinstance(compiled.compiled_layers, InductorLayers)
    counts = [1, 3, 8, 2]
    reference = row_passes(RowModel(model), list(range(1, 41)), counts)
    for n, got, want in zip(counts, row_passes(compiled, list(range(1, 41)), counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5, msg=f"a pass of {n} tokens")
    assert compiled.compiled_layers.failed is None


@pytest.mark.parametrize("name", MODELS)
def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise(name):
    model = MODELS[name](seed=21)
    rng = np.random.default_rng(1)
    prompt, extra = rng.integers(0, TINY_VOCAB, size=140), rng.integers(0, TINY_VOCAB, size=18)
    reference = feed(model, prompt, extra, len(prompt), [1] * len(extra))
    for widths in ([3, 5, 4, 6], [6, 6, 6], [2] * 9):
        logits, cache = feed(model, prompt, extra, len(prompt), widths)
        assert torch.equal(cache, reference[1]), f"keys/values differ: passes {widths}"
        assert torch.equal(logits, reference[0]), f"logits differ: passes {widths}"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face(name):
    model = MODELS[name](seed=5)
    prompts = [[33, 34, 35, 36] * 10, list(range(1, 50)), [5, 17, 42, 9, 9, 13]]  # past the window
    speculative, plain, accepted = speculative_and_plain(model, prompts, 40)
    assert speculative == plain and accepted > 0
    assert plain == [hf_greedy(model, p, 40) for p in prompts]


def test_the_triton_kernels_refuse_a_window_by_name():
    """(Under Triton's interpreter, as the test suite runs on CPU: every other check passes.)"""
    pytest.importorskip("triton")
    model = make_tiny_mistral(layers=1)
    why = unavailable(model, list(model.model.layers), torch.float32, family_of(model.config))
    assert why == f"the kernels have no sliding window ({WINDOW} tokens) yet"
