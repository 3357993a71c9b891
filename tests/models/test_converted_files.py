"""Files as llama.cpp's own converter writes them (`convert_hf_to_gguf.py` from the llama-cpp-python
sdist's vendor tree: `tests/helpers/converter.py`), of a tiny random model of each family our
forward runs (Llama: q/k rows interleaved, a tied head; Qwen2: q/k/v biases; Qwen3: q/k norms, heads
wider than hidden / heads, a head size transformers' GGUF config does not read; Gemma 3: sliding and
full layers with rotary bases of their own, sandwich norms stored as 1 + w, a scaled embedding, a
GELU-tanh gate; Phi-3: q/k/v and gate/up fused, split on loading, and a sliding window in its file that
llama.cpp and transformers leave unread), at Q8_0 with float32 norms (and Llama at F16, Phi-3 at BF16);
and a tiny Llama quantised by llama.cpp's own `llama-quantize` into the kinds gguf cannot make (where a
llama.cpp build is named: `converter.llama_quantize`). specdraft loads each by path natively, its float32
arithmetic gives the logits of transformers' own model of the file bitwise (prefill and passes of 1-32
tokens), its greedy output is transformers' `generate`'s, and in the int8 arithmetic speculative output
equals plain."""

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
from specdraft.models.long_rope import original_context
from tests.helpers.converter import convert, llama_quantize, tiny_family_dir
from tests.helpers.families import long_rope_parameters
from tests.helpers.passes import pass_logits

pytestmark = pytest.mark.slow

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3_text", "phi3"]
# every family at Q8_0, and the float kinds the converter writes (F16, BF16) in two of them, Phi-3 as
# Phi-4-mini: LongRoPE (its factors switching past 128 tokens here; these tests stay within them) over
# part of each head (half of it here)
LONG_ROPE = dict(rope_parameters={**long_rope_parameters(128, pairs=4), "partial_rotary_factor": 0.5},
                 original_max_position_embeddings=128)
CASES = [*((family, "q8_0", {}) for family in FAMILIES), ("llama", "f16", {}), ("phi3", "bf16", LONG_ROPE)]
KINDS = {"q8_0": blocks.Q8_0, "f16": blocks.F16, "bf16": blocks.BF16}  # the converter's outtype -> our kind
PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return", "The capital of France is"]


def transformers_model(path):
    """transformers' own float32 model of a GGUF file."""
    from transformers import AutoModelForCausalLM

    from specdraft.models.gguf_cache import gguf_config

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                config=gguf_config(path)).eval()


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{o}{'-longrope' if c else ''}" for f, o, c in CASES])
def converted(request, tmp_path_factory):
    """(family, path, dense, kind): the converter's file of a tiny model of `family` at an outtype (its
    projections of our `kind`; config fields of its own), and transformers' own float32 model of that file."""
    family, outtype, config = request.param
    folder = tmp_path_factory.mktemp(f"{family}-{outtype}")
    path = convert(tiny_family_dir(family, folder / "hf", **config), folder / f"tiny-{family}-{outtype}.gguf", outtype)
    return family, path, transformers_model(path), KINDS[outtype]


def test_the_converters_file_reads_its_blocks_natively(converted):
    from specdraft.models import load_model

    family, path, dense, kind = converted
    model = load_model(str(path), weights="native", arithmetic="float32").model
    assert model.config.model_type == family == dense.config.model_type
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, blocks.BlockLinear) and attention.q_proj.kind == kind
    # the rotation transformers gives the file (LongRoPE's short factors: read from the file, not left out)
    ours, theirs = (dict(m.model.rotary_emb.named_buffers()) for m in (model, dense))  # Gemma's: a set a layer type
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
    fused = [model.model.layers[0].get_submodule(f.module) for f in family_of(model.config).fused]
    assert all(isinstance(module, Joined) for module in fused)  # split into the parts, no weights of its own
    head = {"qwen3": 32, "gemma3_text": 256}.get(family, 16)
    assert family_of(model.config).shape == family_of(dense.config).shape == (4, 2, head)
    phi4 = family == "phi3" and kind == blocks.BF16  # LongRoPE over half of each head
    assert original_context(model.config) == original_context(dense.config) == (128 if phi4 else None)
    assert family_of(model.config).rotated == family_of(dense.config).rotated == (8 if phi4 else head)


def test_the_float32_arithmetic_gives_transformers_logits_bitwise_and_its_greedy_output(converted):
    _, path, dense, _ = converted
    float32_logits_and_greedy_are_transformers(path, dense)


def float32_logits_and_greedy_are_transformers(path, dense) -> None:
    """specdraft's float32 arithmetic on the file read natively gives the logits of transformers' model of
    it (`dense`) bitwise, prefill and passes of 1-32 tokens, and its greedy output."""
    from specdraft.models import load_model

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

    loaded = load_model(str(converted[1]), weights="native", arithmetic="int8")  # F16, BF16: tokens rounded
    llm = LLM(loaded, drafters=["none", "ngram"], k=4, calibrate=False)
    sampling = SamplingParams(max_tokens=32)
    speculative = llm.generate(PROMPTS, sampling, SpeculationParams("ngram", policy="fixed"))
    plain = llm.generate(PROMPTS, sampling, SpeculationParams("none"))
    assert [c.token_ids for c in speculative] == [c.token_ids for c in plain]


# What users download, as llama.cpp's own `llama-quantize` makes it (the K kinds and IQ4s gguf cannot
# quantise; the mixes: Q4_K_M holds Q4_K and Q6_K, Q3_K_M Q3_K, Q4_K and Q5_K)
QUANTIZED = ["Q4_0", "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"]


@pytest.fixture(scope="module")
def f32_llama(tmp_path_factory):
    """The converter's float32 file of a tiny Llama with rows of 256 and 512 weights (whole K super-blocks)."""
    folder = tmp_path_factory.mktemp("llama-f32")
    model_dir = tiny_family_dir("llama", folder / "hf", hidden_size=256, intermediate_size=512)
    return convert(model_dir, folder / "tiny-llama-f32.gguf", "f32")


@pytest.mark.parametrize("kind", QUANTIZED)
def test_llama_quantizes_files_read_natively_as_transformers_reads_them(f32_llama, kind, tmp_path):
    """Each of llama-quantize's files: every weight read as the file's blocks (its kind among them), the
    float32 arithmetic's logits transformers' bitwise and its greedy output transformers', and in the int8
    arithmetic speculative output equal to plain."""
    from specdraft.models import load_model
    from specdraft.models.gguf_check import check_gguf
    from specdraft.models.verdict import read_as_blocks, weights_of

    path = llama_quantize(f32_llama, tmp_path / f"tiny-llama-{kind}.gguf", kind)
    weights = weights_of(check_gguf(path).tensors)
    assert kind.removesuffix("_M") in {t.kind.name for t in weights}
    assert all(read_as_blocks(t) for t in weights), sorted({t.kind.name for t in weights})
    float32_logits_and_greedy_are_transformers(path, transformers_model(path))
    llm = LLM(load_model(str(path), weights="native", arithmetic="int8"), drafters=["none", "ngram"], k=4,
              calibrate=False)
    sampling = SamplingParams(max_tokens=24)
    speculative = llm.generate(PROMPTS, sampling, SpeculationParams("ngram", policy="fixed"))
    assert [c.token_ids for c in speculative] == [c.token_ids for c in llm.generate(PROMPTS, sampling, SpeculationParams("none"))]
