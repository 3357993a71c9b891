"""Files as llama.cpp's own converter writes them (`convert_hf_to_gguf.py` from the llama-cpp-python
sdist's vendor tree: `tests/helpers/converter.py`), of a tiny random model of each family our
forward runs (Llama: q/k rows interleaved, a tied head; Qwen2: q/k/v biases; Qwen3: q/k norms, heads
wider than hidden / heads, a head size transformers' GGUF config does not read; Gemma 3: sliding and
full layers with rotary bases of their own, sandwich norms stored as 1 + w, a scaled embedding, a
GELU-tanh gate; Phi-3: q/k/v and gate/up fused, split on loading, and a sliding window in its file that
llama.cpp and transformers leave unread), at Q8_0 with float32 norms: specdraft loads each by path natively, its float32 arithmetic gives the logits of
transformers' own model of the file bitwise (prefill and passes of 1-32 tokens), its greedy output
is transformers' `generate`'s, and in the int8 arithmetic speculative output equals plain."""

from __future__ import annotations

import copy

import pytest
import torch

from specdraft import LLM, SamplingParams, SpeculationParams
from specdraft.backend import native as blocks
from specdraft.backend.family import family_of
from specdraft.backend.linear import use_few_rows_linears
from specdraft.backend.numba_layers import MAX_TOKENS
from specdraft.models.fused import Joined, unfuse
from tests.helpers.converter import convert, tiny_family_dir
from tests.helpers.passes import pass_logits

pytestmark = pytest.mark.slow

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3_text", "phi3"]
PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return", "The capital of France is"]


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    """(family, path, dense): the converter's Q8_0 file of a tiny model of `family`, and transformers'
    own float32 model of that file."""
    from transformers import AutoModelForCausalLM

    from specdraft.models.gguf_cache import gguf_config

    folder = tmp_path_factory.mktemp(request.param)
    path = convert(tiny_family_dir(request.param, folder / "hf"), folder / f"tiny-{request.param}-q8_0.gguf")
    dense = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 config=gguf_config(path)).eval()
    return request.param, path, dense


def test_the_converters_file_reads_its_blocks_natively(converted):
    from specdraft.models import load_model

    family, path, dense = converted
    model = load_model(str(path), weights="native", arithmetic="float32").model
    assert model.config.model_type == family == dense.config.model_type
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, blocks.BlockLinear) and attention.q_proj.kind == blocks.Q8_0
    fused = [model.model.layers[0].get_submodule(f.module) for f in family_of(model.config).fused]
    assert all(isinstance(module, Joined) for module in fused)  # split into the parts, no weights of its own
    head = {"qwen3": 32, "gemma3_text": 256}.get(family, 16)
    assert family_of(model.config).shape == family_of(dense.config).shape == (4, 2, head)


def test_the_float32_arithmetic_gives_transformers_logits_bitwise_and_its_greedy_output(converted):
    from specdraft.models import load_model

    _, path, dense = converted
    loaded = load_model(str(path), weights="native", arithmetic="float32")
    reference = copy.deepcopy(dense)
    unfuse(reference, family_of(reference.config))  # as the loader builds a model on CPU (Phi-3's parts split)
    use_few_rows_linears(reference)
    prompt = list(range(100, 100 + 2 * MAX_TOKENS + 9))
    counts = [1, 6, MAX_TOKENS, 1, 3]
    for n, got, want in zip(["prefill", *counts], pass_logits(loaded.model, prompt, counts),
                            pass_logits(reference, prompt, counts)):
        assert torch.equal(got, want), f"a pass of {n}"
    llm = LLM(loaded, drafters=["none"], calibrate=False)
    ours = [c.token_ids for c in llm.generate(PROMPTS, SamplingParams(max_tokens=24), SpeculationParams("none"))]
    with torch.inference_mode():
        for prompt, got in zip(PROMPTS, ours):
            ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
            want = dense.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids))
            want = want[0, ids.shape[1]:].tolist()
            # ours leaves out a stop token that ends the reply early; transformers' keeps it
            assert got == want[: len(got)] and len(want) - len(got) in (0, 1) and len(got) > 0, prompt


def test_the_int8_arithmetic_speculates_as_it_decodes(converted):
    from specdraft.models import load_model

    loaded = load_model(str(converted[1]), weights="native", arithmetic="int8")
    llm = LLM(loaded, drafters=["none", "ngram"], k=4, calibrate=False)
    sampling = SamplingParams(max_tokens=32)
    speculative = llm.generate(PROMPTS, sampling, SpeculationParams("ngram", policy="fixed"))
    plain = llm.generate(PROMPTS, sampling, SpeculationParams("none"))
    assert [c.token_ids for c in speculative] == [c.token_ids for c in plain]
