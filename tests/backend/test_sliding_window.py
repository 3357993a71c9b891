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

import numpy as np
import pytest
import torch

from specdraft.backend.family import family_of, family_problem
from specdraft.backend.triton_layers import unavailable
from tests.helpers.family_checks import (greedy_equals_plain_and_hugging_face, inductor_equals_eager,
                                         numba_equals_eager, own_forward_equals_stock,
                                         verify_passes_equal_plain_steps)
from tests.helpers.families import make_tiny_qwen2
from tests.helpers.tiny import TINY_VOCAB, hf_greedy

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
    listed = make_tiny_mistral(layers=2).config
    listed.layer_types = ["full_attention", "sliding_attention"]  # Mistral's model reads no layer types
    assert family_of(listed).sliding == (True, True)
    chunked = make_windowed_qwen2().config
    chunked.layer_types = ["chunked_attention"]
    assert family_problem(chunked) == "layers of attention other than full or sliding: ['chunked_attention']"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-5), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(name, dtype, atol):
    """(float64 to 1e-5 only: the norms compute in float32 whatever the model's dtype.)"""
    own_forward_equals_stock(MODELS[name](seed=3, dtype=dtype), atol, longest=60)


@pytest.mark.parametrize("name", MODELS)
def test_numba_passes_equal_the_eager_layers_for_every_token_count(name):
    numba_equals_eager(MODELS[name](seed=11), atol=5e-5)


def test_inductors_parts_equal_the_eager_layers(monkeypatch):
    inductor_equals_eager(make_windowed_qwen2(seed=13), list(range(1, 41)), monkeypatch)


@pytest.mark.parametrize("name", MODELS)
def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise(name):
    verify_passes_equal_plain_steps(MODELS[name](seed=21))


@pytest.mark.parametrize("name", MODELS)
def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face(name):
    prompts = [[33, 34, 35, 36] * 10, list(range(1, 50)), [5, 17, 42, 9, 9, 13]]  # past the window
    greedy_equals_plain_and_hugging_face(MODELS[name](seed=5), prompts)


def test_the_triton_kernels_refuse_a_window_by_name():
    """(Under Triton's interpreter, as the test suite runs on CPU: every other check passes.)"""
    pytest.importorskip("triton")
    model = make_tiny_mistral(layers=1)
    why = unavailable(model, list(model.model.layers), torch.float32, family_of(model.config))
    assert why == f"the kernels have no sliding window ({WINDOW} tokens) yet"


def test_a_conversation_hits_the_prefix_cache_and_decodes_as_without_it():
    """Each turn's prompt is the last one, its reply and new tokens, well past the window: a hit reuses
    the history's entries (all kept, each layer masking its own window) and decodes as a cold run."""
    from specdraft.params import SamplingParams, SpeculationParams
    from specdraft.runtime import build_runtime
    from specdraft.settings import Settings
    from tests.helpers.tiny import loaded

    model = make_windowed_qwen2(seed=7)
    engines = {mb: build_runtime(loaded(model), Settings(drafters=["ngram"], k=4, policy="fixed", calibrate=False,
                                                          prefix_cache_mb=mb)).engine for mb in (0, 16)}
    turns = {}
    for mb, engine in engines.items():
        rng, prompt, turns[mb] = np.random.default_rng(0), list(range(3, 27)), []
        for _ in range(3):
            [done] = engine.run([(prompt, SamplingParams(max_tokens=16), SpeculationParams("ngram"))])
            turns[mb].append((prompt, done.token_ids, done.metrics.cached_tokens))
            prompt = prompt + done.token_ids + rng.integers(3, 90, 7).tolist()
    assert [o for _, o, _ in turns[0]] == [o for _, o, _ in turns[16]]
    assert [c for _, _, c in turns[0]] == [0, 0, 0] and all(c > WINDOW for _, _, c in turns[16][1:])
    for prompt, output, _ in turns[16]:
        assert output == hf_greedy(model, prompt, 16)
