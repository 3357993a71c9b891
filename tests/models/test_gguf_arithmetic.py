"""A GGUF is decoded as the model computes, or refused. A tiny Llama with a llama3 rope scaling,
written as llama.cpp's converter writes Llama 3.x (its scaling as `rope_freqs` factors), loads through
specdraft (native float32 and int8, dense) to the greedy tokens, and float32 logits, of transformers'
own llama3 model on the same weights; the same file without the factors decodes as the unscaled model,
which differs. Every tensor and metadata value that would change the arithmetic and that specdraft
does not implement is refused in one line naming it; its neutral values pass."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft import LLM
from specdraft.backend import RowModel
from specdraft.errors import BadModelFileError
from specdraft.backend.family import FAMILIES
from specdraft.models.gguf_check import ROPE_FREQS, UNIMPLEMENTED, check_gguf
from specdraft.params import SamplingParams, SpeculationParams
from tests.helpers.tiny import hf_greedy, make_tiny_model
from tests.helpers.gguf_files import SMALL_HEADS, SMALL_WIDTH, write_model_gguf, write_small

THETA, HEAD_DIM = 10000.0, 16  # make_tiny_model: hidden 64 over 4 heads
# Llama 3.1's shape at a small scale: the original context short enough that a 16-wide head's pairs
# fall in all three of the scaling's bands (left, smoothed, divided by the factor).
SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
PROMPT = [5, 17, 42, 9, 9, 13, 60, 2, 33, 34, 35, 36, 33, 34, 35, 36, 71, 3, 8, 64, 12, 50]
NEW_TOKENS = 24
EOS = 95  # `tests.helpers.gguf_files`' tokenizer: the last id
LOADS = [("native", "float32"), ("native", "int8"), ("dense", "float32")]


def plain_frequencies() -> torch.Tensor:
    """base^(-2i/d), float32 [HEAD_DIM / 2], as transformers' default rotary embedding computes it."""
    return 1.0 / (THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM))


def llama_cpp_factors() -> np.ndarray:
    from tests.helpers.gguf_files import llama3_rope_freqs

    return llama3_rope_freqs(THETA, HEAD_DIM, SCALING["factor"], SCALING["low_freq_factor"],
                             SCALING["high_freq_factor"], SCALING["original_max_position_embeddings"])


def unscaled(model):
    """A copy of `model` rotating at the plain frequencies."""
    plain = copy.deepcopy(model)
    plain.model.rotary_emb.inv_freq.copy_(plain_frequencies())
    return plain


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple:
    """(reference, with, without): transformers' Llama with the llama3 scaling, holding the file's
    values; a GGUF of it with `rope_freqs`; the same without."""
    folder = tmp_path_factory.mktemp("llama3")
    reference = make_tiny_model(seed=3, dtype=torch.float32, layers=2,
                                rope_parameters={"rope_type": "llama3", "rope_theta": THETA, **SCALING})
    with torch.no_grad():  # attention peaked enough that where a token attends turns on its rotation
        for layer in reference.model.layers:
            layer.self_attn.q_proj.weight.mul_(3.0)
            layer.self_attn.k_proj.weight.mul_(3.0)
    with_factors = write_model_gguf(reference, folder / "llama3.gguf", tensors={ROPE_FREQS: llama_cpp_factors()})
    without = write_model_gguf(copy.deepcopy(reference), folder / "plain.gguf")
    return reference, with_factors, without


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache dir of this module's own (a dense load converts the file into it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


def load(path: Path, weights: str, arithmetic: str):
    from specdraft.models import load_model

    loaded = load_model(str(path), device="cpu", weights=weights, arithmetic=arithmetic)
    assert (loaded.weights, loaded.arithmetic) == (weights, arithmetic)
    return loaded


def greedy(loaded) -> dict[str, list[int]]:
    """The loaded model's greedy continuation of PROMPT through `LLM`: plain, and ngram's drafts verified."""
    llm = LLM(loaded, drafters=["none", "ngram"], k=4, calibrate=False)
    sampling = SamplingParams(max_tokens=NEW_TOKENS)
    return {drafter: llm.generate([PROMPT], sampling, SpeculationParams(drafter, policy="fixed"))[0].token_ids
            for drafter in ("none", "ngram")}


def test_llama_cpps_factors_are_transformers_llama3_scaling_and_change_the_frequencies():
    factors = llama_cpp_factors()
    assert factors[0] == 1.0 and 1.0 < factors[1] < SCALING["factor"] and set(factors[2:]) == {SCALING["factor"]}
    theirs = make_tiny_model(seed=0, dtype=torch.float32, rope_parameters={
        "rope_type": "llama3", "rope_theta": THETA, **SCALING}).model.rotary_emb.inv_freq
    torch.testing.assert_close(theirs, plain_frequencies() / torch.from_numpy(factors), rtol=1e-6, atol=0)


def test_the_scaling_changes_the_reference(files):
    reference, _, _ = files
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        gap = (reference(ids).logits - unscaled(reference)(ids).logits).abs().max()
    assert gap > 1.0
    assert hf_greedy(reference, PROMPT, NEW_TOKENS, EOS) != hf_greedy(unscaled(reference), PROMPT, NEW_TOKENS, EOS)


@pytest.mark.parametrize("weights, arithmetic", LOADS, ids=["-".join(load) for load in LOADS])
def test_a_llama3_file_decodes_as_transformers_llama3_model(files, cache, weights, arithmetic):
    reference, with_factors, _ = files
    loaded = load(with_factors, weights, arithmetic)
    rotary = loaded.model.model.rotary_emb
    scaled = plain_frequencies() / torch.from_numpy(llama_cpp_factors())
    assert torch.equal(rotary.inv_freq, scaled) and torch.equal(rotary.original_inv_freq, scaled)
    expected = hf_greedy(reference, PROMPT, NEW_TOKENS, EOS)
    assert greedy(loaded) == {"none": expected, "ngram": expected}
    if arithmetic == "float32":
        assert_logits_close(loaded.model, reference)


def assert_logits_close(model, reference) -> None:
    """Our forward's logits (a prefill, then passes of 1 and 6 tokens) are the reference's on the whole sequence."""
    rng = np.random.default_rng(1)
    passes = [rng.integers(0, EOS, size=n).tolist() for n in (1, 6)]
    rows = RowModel(model, compiled=True)
    rows.add("r", active=True)
    ours = [rows.prefill("r", PROMPT)[None]]  # [1, vocab]: the prompt's last position
    for ids in passes:
        ours.append(rows.forward(rows.active_window, torch.tensor([ids]))[0])  # [T, vocab]
        rows.commit(rows.active_window, [len(ids)])
    sequence = PROMPT + [t for ids in passes for t in ids]
    with torch.no_grad():
        theirs = reference(torch.tensor([sequence])).logits[0, len(PROMPT) - 1:]  # [1 + 1 + 6, vocab]
    torch.testing.assert_close(torch.cat(ours), theirs, rtol=1e-4, atol=1e-3)


def test_the_file_without_factors_decodes_as_the_unscaled_model(files, cache):
    """The negative control: what a load that left `rope_freqs` out would give is not the model's."""
    reference, _, without = files
    plain = hf_greedy(unscaled(reference), PROMPT, NEW_TOKENS, EOS)
    assert greedy(load(without, "native", "float32"))["none"] == plain != hf_greedy(reference, PROMPT, NEW_TOKENS, EOS)


# -- what is refused -------------------------------------------------------------------------------

HEAD = SMALL_WIDTH // SMALL_HEADS
F32 = np.float32


def refused(path: Path, *words: str) -> None:
    with pytest.raises(BadModelFileError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert message.startswith(f"bad model file {path}: ") and "\n" not in message, message
    for word in words:
        assert word in message, message


def other_than(neutral: tuple) -> object:
    """A value of a key of `UNIMPLEMENTED` that asks for what specdraft does not implement."""
    first = neutral[0]
    if isinstance(first, bool):
        return not first
    return {str: "yarn", int: 4096, float: 2.0}[type(first)]


@pytest.mark.parametrize("row", UNIMPLEMENTED, ids=[row.key for row in UNIMPLEMENTED])
def test_a_key_asking_for_unimplemented_arithmetic_is_refused_by_name(row, tmp_path):
    value = other_than(row.neutral)
    refused(write_small(tmp_path / "other.gguf", keys={row.key: value}), f"llama.{row.key} is {value!r}", row.asks)
    for i, neutral in enumerate(row.neutral):
        assert check_gguf(write_small(tmp_path / f"neutral{i}.gguf", keys={row.key: neutral})).architecture == "llama"


TENSORS = [  # (family, tensor name, shape, dtype, what the message says)
    ("llama", "blk.0.attn_q_norm.weight", (HEAD,), F32, "'blk.0.attn_q_norm.weight' is not one"),
    ("llama", "blk.0.attn_k_norm.weight", (HEAD,), F32, "'blk.0.attn_k_norm.weight' is not one"),
    ("llama", "blk.0.ffn_gate_inp.weight", (8, SMALL_WIDTH), F32, "'blk.0.ffn_gate_inp.weight'"),
    ("llama", "blk.0.ffn_up_exps.weight", (8, 32, SMALL_WIDTH), F32, "'blk.0.ffn_up_exps.weight'"),
    ("llama", "blk.0.attn_sinks.weight", (SMALL_HEADS,), F32, "'blk.0.attn_sinks.weight'"),
    ("llama", "blk.0.post_attention_norm.weight", (SMALL_WIDTH,), F32, "'blk.0.post_attention_norm.weight'"),
    ("llama", "rope_factors_long.weight", (HEAD // 2,), F32, "'rope_factors_long.weight'"),
    ("llama", "blk.0.attn_q.bias", (SMALL_WIDTH,), F32, "'blk.0.attn_q.bias' is not one specdraft's llama"),
    ("qwen2", "blk.0.attn_output.bias", (SMALL_WIDTH,), F32, "'blk.0.attn_output.bias' is not one specdraft's qwen2"),
    ("qwen2", ROPE_FREQS, (HEAD // 2,), F32, "'rope_freqs.weight' is not one specdraft's qwen2"),
    ("llama", "blk.x.attn_q.weight", (SMALL_WIDTH, SMALL_WIDTH), F32, "'blk.x.attn_q.weight'"),
    ("llama", ROPE_FREQS, (HEAD // 4,), F32, "'rope_freqs.weight' is F32 of shape (4,), not float32"),
    ("llama", ROPE_FREQS, (HEAD // 2,), np.float16, "'rope_freqs.weight' is F16"),
]


@pytest.mark.parametrize("family, name, shape, dtype, words", TENSORS,
                         ids=[f"{family}-{name}-{len(shape)}" for family, name, shape, *_ in TENSORS])
def test_a_tensor_the_loader_does_not_read_is_refused_by_name(family, name, shape, dtype, words, tmp_path):
    refused(write_small(tmp_path / "extra.gguf", family, tensors={name: np.ones(shape, dtype)}), words)


HEADS = {  # (family, keys) -> what the message says
    ("llama", (("rope.dimension_count", HEAD // 2),)): "llama.rope.dimension_count is 8, not the key head size 16 "
                                                       "(embedding_length / head_count): rotary embedding on part",
    ("llama", (("attention.key_length", 2 * HEAD), ("attention.value_length", 2 * HEAD))):
        "the head size transformers loads it with (embedding_length / head_count) is 16, not the key head size 32",
    ("llama", (("attention.value_length", 2 * HEAD),)): "llama.attention.value_length is 32, not the key head size 16",
    ("qwen2", (("attention.key_length", 2 * HEAD), ("attention.value_length", 2 * HEAD),
               ("rope.dimension_count", 2 * HEAD))):
        "the head size transformers loads it with (embedding_length / head_count) is 16, not the key head size 32 "
        "(qwen2.attention.key_length)",
}


@pytest.mark.parametrize("case", HEADS, ids=["partial-rotary", "llama-key-length", "value-length", "qwen2-key-length"])
def test_heads_of_sizes_the_loader_does_not_take_are_refused(case, tmp_path):
    family, keys = case
    refused(write_small(tmp_path / "heads.gguf", family, keys=dict(keys)), HEADS[case])


def test_a_phi3_files_rotary_embedding_over_part_of_each_head_passes_and_is_read(tmp_path):
    """Phi-4-mini's partial rotary (`rope.dimension_count` below the head size), which Phi-3's loader
    reads into the config (`gguf_cache.gguf_config`; `tests/models/test_converted_files.py` decodes such
    a file); an odd count, no whole pairs, is refused."""
    keys = {"rope.dimension_count": HEAD // 2}
    assert check_gguf(write_small(tmp_path / "phi4.gguf", "phi3", keys=keys, projection="attn_qkv")).architecture == "phi3"
    refused(write_small(tmp_path / "odd.gguf", "phi3", keys={"rope.dimension_count": HEAD // 2 + 1}, projection="attn_qkv"),
            "phi3.rope.dimension_count is 9, not the key head size 16")


def test_heads_of_another_size_than_width_over_heads_pass_where_the_loader_takes_it(tmp_path):
    """Llama's config takes a head's size from rope.dimension_count (transformers' GGUF mapping)."""
    keys = {"attention.key_length": 2 * HEAD, "attention.value_length": 2 * HEAD, "rope.dimension_count": 2 * HEAD}
    factors = {ROPE_FREQS: np.ones(HEAD, F32)}  # one per pair of a head's 32 dimensions
    assert check_gguf(write_small(tmp_path / "wide.gguf", keys=keys, tensors=factors)).architecture == "llama"


def test_every_tensor_a_family_reads_is_one_transformers_maps_or_rotary_factors():
    from specdraft.backend.family import LONG_ROPE
    from specdraft.backend.native.gguf_file import transformers_name

    for family in FAMILIES.values():
        names = {*family.file.top, *(f"blk.7.{part}" for part in family.file.layer)} - {ROPE_FREQS, *LONG_ROPE}
        assert names and all(transformers_name(name, family.file.modules) is not None for name in names), names
    assert ROPE_FREQS in FAMILIES["llama"].file.top and set(LONG_ROPE) <= FAMILIES["phi3"].file.top
    gemma = FAMILIES["gemma3_text"].file.modules  # its ffn_norm is its MLP's input norm, not Llama's post-attention one
    assert transformers_name("blk.2.ffn_norm.weight", gemma) == "model.layers.2.pre_feedforward_layernorm.weight"
    assert transformers_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"


def test_a_sliding_window_is_read_where_the_family_implements_it(tmp_path):
    """Gemma 3's files set attention.sliding_window, which its family reads; a Llama file's is refused
    (`test_a_key_asking_for_unimplemented_arithmetic_is_refused_by_name`)."""
    path = write_small(tmp_path / "gemma3.gguf", "gemma3", keys={"attention.sliding_window": 512})
    assert check_gguf(path).architecture == "gemma3"


def test_a_phi3_files_window_passes_unread_and_its_128k_factors_are_read_whole_or_refused(tmp_path):
    """Phi-3's files set its config's sliding window, which llama.cpp turns off and transformers' GGUF
    config does not read: its family ignores it. Its 128k models' LongRoPE (both sets of factors, the
    original context, an attention factor) is read (`models.long_rope`); a part of it is refused by name,
    and so is an attention factor without it."""
    path = write_small(tmp_path / "phi3.gguf", "phi3", keys={"attention.sliding_window": 2047}, projection="attn_qkv")
    assert check_gguf(path).architecture == "phi3"
    pairs = SMALL_WIDTH // SMALL_HEADS // 2
    factors = {name: np.ones(pairs, np.float32) for name in ("rope_factors_short.weight", "rope_factors_long.weight")}
    scaling = {"rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.19}
    path = write_small(tmp_path / "phi3-128k.gguf", "phi3", keys=scaling, tensors=factors, projection="attn_qkv")
    assert check_gguf(path).architecture == "phi3"
    for name, keys, tensors, match in [
            ("long-only", scaling, {"rope_factors_long.weight": factors["rope_factors_long.weight"]},
             "rope_factors_long.weight without rope_factors_short.weight"),
            ("no-context", {"rope.scaling.attn_factor": 1.19}, factors, "without its original context"),
            ("factor-only", {"rope.scaling.attn_factor": 1.19}, {}, "phi3.rope.scaling.attn_factor is 1.19"),
            ("wrong-shape", scaling, {**factors, "rope_factors_long.weight": np.ones(pairs + 1, np.float32)},
             "not float32 rotary factors, one per pair")]:
        path = write_small(tmp_path / f"phi3-{name}.gguf", "phi3", keys=keys, tensors=tensors, projection="attn_qkv")
        with pytest.raises(BadModelFileError, match=match):
            check_gguf(path)


def test_a_tiny_qwen2_model_file_passes(tmp_path):
    from tests.helpers.families import make_tiny_qwen2

    path = write_model_gguf(make_tiny_qwen2(4, 2, 32, seed=1), tmp_path / "qwen2.gguf")
    assert check_gguf(path).architecture == "qwen2"


def test_load_model_refuses_before_converting(tmp_path, monkeypatch):
    from specdraft.models import loader

    monkeypatch.setattr(loader, "convert_gguf", lambda path: pytest.fail("a refused file reached the conversion"))
    path = write_small(tmp_path / "moe.gguf", keys={"expert_count": 8})
    with pytest.raises(BadModelFileError, match="llama.expert_count is 8: a mixture of experts"):
        loader.load_model(str(path), device="cpu", weights="dense")
