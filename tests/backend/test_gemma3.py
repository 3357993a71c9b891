"""Gemma 3 (text) in our forward, a family as a row (`specdraft.backend.family.FAMILIES`): a scaled
embedding, (1 + w) norms computed in float32, q/k norms, norms of the attention's and the MLP's
outputs before each joins the stream, a GELU-tanh gate, sliding layers beside a full one with
rotary bases of their own (10,000 and 1,000,000), a tied head. A tiny random Gemma 3 built
in-process (3 layers, the first and last sliding over 8 tokens): our forward gives the stock
model's logits across rows and packed passes; numba's compiled layers equal the eager ones for
every token count; the compiled CPU step gives a token bitwise the same logits, keys and values in a
plain step and in verify passes of any width; greedy speculative output equals plain greedy and
Hugging Face `generate`'s. Inductor's parts and the Triton kernels do not take it. The real Gemma 3
270M, fetched by name (slow): read natively, its greedy output is transformers' own on its file,
in the float32 arithmetic, and speculative output equals plain in the int8 one."""

from __future__ import annotations

import pytest
import torch

from specdraft.backend import forward
from specdraft.backend import native as blocks
from specdraft.backend.family import family_of, family_problem
from specdraft.backend.inductor import InductorLayers
from specdraft.backend.triton_layers import unavailable
from tests.helpers.families import make_tiny_gemma3
from tests.helpers.family_checks import (greedy_equals_plain_and_hugging_face, numba_equals_eager,
                                         own_forward_equals_stock, verify_passes_equal_plain_steps)


def test_a_gemma3_config_is_described_by_its_row():
    family = family_of(make_tiny_gemma3().config)
    assert (family.model_type, family.shape, family.tied_head, family.qk_norm) == ("gemma3_text", (4, 2, 16), True, True)
    assert (family.norm_offset, family.sandwich_norms, family.activation) == (1.0, True, "gelu_tanh")
    assert (family.window, family.sliding, family.local_rope, family.rope_theta) == (8, (True, False, True), True, 1e6)
    capped = make_tiny_gemma3().config
    capped.final_logit_softcapping = 30.0
    assert family_problem(capped) == "final_logit_softcapping 30.0"
    scaled = make_tiny_gemma3().config
    scaled.query_pre_attn_scalar = 256
    assert family_problem(scaled) == "attention scaled by query_pre_attn_scalar 256, not the head size 16"
    embedding = make_tiny_gemma3().config
    embedding.use_bidirectional_attention = True
    assert family_problem(embedding) == "bidirectional attention (an embedding model)"
    windowless = make_tiny_gemma3().config
    windowless.sliding_window = None
    assert family_problem(windowless) == "sliding layers without a window"


def test_our_forward_takes_a_gemma3_only_with_its_sandwich_norms():
    model = make_tiny_gemma3()
    assert forward.supports(model)
    del model.model.layers[0].post_feedforward_layernorm
    assert not forward.supports(model)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-5), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(dtype, atol):
    """(float64 to 1e-5 only: Gemma's norms compute in float32 whatever the model's dtype.)"""
    own_forward_equals_stock(make_tiny_gemma3(seed=3, dtype=dtype), atol)


def test_numba_passes_equal_the_eager_layers_for_every_token_count():
    numba_equals_eager(make_tiny_gemma3(seed=11), atol=2e-5)


def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise():
    verify_passes_equal_plain_steps(make_tiny_gemma3(seed=21))


def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face():
    prompts = [[33, 34, 35, 36] * 6, list(range(1, 30)), [5, 17, 42, 9, 9, 13]]  # past the window of 8
    greedy_equals_plain_and_hugging_face(make_tiny_gemma3(seed=5), prompts)


def test_inductor_and_triton_do_not_take_it():
    """Gemma's layers run numba's stack or the eager layers (the Triton check under Triton's
    interpreter, as the suite runs on CPU: every check before the family's passes)."""
    model = make_tiny_gemma3()
    layers = list(model.model.layers)
    assert not InductorLayers.applies(model, layers, torch.float32)
    pytest.importorskip("triton")
    assert unavailable(model, layers, torch.float32, family_of(model.config)) == (
        "the kernels have no (1 + w) or sandwich norms, nor a rotary base per layer type (Gemma's), yet")


# -- the real Gemma 3 270M ----------------------------------------------------------------------------


PROMPTS = ["The capital of France is", "def fibonacci(n):", '{"name": "Alice", "age": 30, "city":']


@pytest.mark.slow
def test_the_real_270m_decodes_as_transformers_does():
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from specdraft import LLM, SamplingParams, SpeculationParams
    from specdraft.models import load_model
    from specdraft.models.find import fetch
    from specdraft.models.gguf_cache import gguf_config

    path = Path(fetch("gemma-3-270m", progress=False))
    loaded = load_model(str(path), weights="native", arithmetic="float32")
    assert isinstance(loaded.model.model.layers[0].self_attn.q_proj, blocks.BlockLinear)
    llm = LLM(loaded, drafters=["none"], calibrate=False)
    ours = [c.token_ids for c in llm.generate(PROMPTS, SamplingParams(max_tokens=32), SpeculationParams("none"))]
    dense = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 config=gguf_config(path)).eval()
    with torch.inference_mode():
        for prompt, got in zip(PROMPTS, ours):
            ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
            want = dense.generate(ids, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids))
            assert got == want[0, ids.shape[1]:].tolist() and len(got) == 32, prompt
    int8 = LLM(load_model(str(path), weights="native", arithmetic="int8"), drafters=["none", "ngram"], k=4,
               calibrate=False)
    sampling = SamplingParams(max_tokens=32)
    speculative = int8.generate(PROMPTS, sampling, SpeculationParams("ngram", policy="fixed"))
    plain = int8.generate(PROMPTS, sampling, SpeculationParams("none"))
    assert [c.token_ids for c in speculative] == [c.token_ids for c in plain]
