"""Tiny GGUF files as llama.cpp writes them: a tiny model's that loads whole through specdraft (its
config as metadata, a byte-level tokenizer, its tensors by `tests.backend.test_blocks.write_gguf`),
Llama 3's rotary factors as llama.cpp's converter computes them (`llama3_rope_freqs`), and a file
of a few tensors and keys for what the check refuses (`write_small`)."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np

from specdraft.backend.family import family_of
from tests.backend.test_blocks import write_gguf

EOS = "<|endoftext|>"


def llama3_rope_freqs(theta: float, head_dim: int, factor: float, low_freq_factor: float,
                      high_freq_factor: float, original_context: int) -> np.ndarray:
    """float32 [head_dim / 2]: the `rope_freqs` factors llama.cpp's convert_hf_to_gguf.py writes for a
    llama3 rope scaling: pair i's plain frequency base^(-2i/d) is left (factor 1) where its wavelength
    is under original_context / high_freq_factor, divided by `factor` where it is over
    original_context / low_freq_factor, and between them smoothly (1 / ((1 - s) / factor + s))."""
    plain = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low, high = original_context / low_freq_factor, original_context / high_freq_factor
    factors = []
    for frequency in plain:
        wavelength = 2 * math.pi / frequency
        if wavelength < high:
            factors.append(1.0)
        elif wavelength > low:
            factors.append(factor)
        else:
            smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def write_model_gguf(model, path: Path, tensors: dict[str, np.ndarray] | None = None,
                     keys: dict[str, object] | None = None) -> Path:
    """`model` (a tiny Llama or Qwen2) as a GGUF specdraft loads whole (`write_gguf`'s Q4_1/Q8_0
    tensors, the model then holding their values), with its config as metadata, a byte-level
    tokenizer of one character per vocabulary id (and one merge; the last id the end of text), `tensors` added (e.g.
    rope_freqs) and `keys` (after `{architecture}.`) set."""
    def describe(writer: gguf.GGUFWriter) -> None:
        _config(writer, model.config)
        _tokenizer(writer, model.config.vocab_size)
        for name, values in (tensors or {}).items():
            writer.add_tensor(name, values)
        for key, value in (keys or {}).items():
            add_key(writer, f"{model.config.model_type}.{key}", value)

    write_gguf(model, path, extra=describe)
    return path


def _config(writer: gguf.GGUFWriter, config) -> None:
    family = family_of(config)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(family.heads)
    writer.add_head_count_kv(family.kv_heads)
    writer.add_rope_freq_base(family.rope_theta)
    writer.add_rope_dimension_count(family.head_dim)
    writer.add_layer_norm_rms_eps(family.norm_eps)
    writer.add_vocab_size(config.vocab_size)


def _tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    characters = list(bytes_to_unicode().values())[: vocab_size - 2]
    tokens = [*characters, characters[0] + characters[1], EOS]  # one merge, the first two characters
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (vocab_size - 1) + [gguf.TokenType.CONTROL])
    writer.add_token_merges([f"{characters[0]} {characters[1]}"])
    writer.add_eos_token_id(vocab_size - 1)
    writer.add_bos_token_id(vocab_size - 1)


def add_key(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    """A scalar key-value of the GGUF type a Python value has (bool, int, float, str)."""
    kinds = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32,
             str: gguf.GGUFValueType.STRING}
    writer.add_key_value(key, value, kinds[type(value)])


SMALL_WIDTH, SMALL_HEADS = 64, 4  # a head of 16: rope_freqs holds 8 factors


def write_small(path: Path, architecture: str = "llama", tensors: dict[str, np.ndarray] | None = None,
                keys: dict[str, object] | None = None) -> Path:
    """A GGUF of a few float32 tensors a family's loader reads (an embedding, a projection, a norm),
    its width and heads in its metadata, then `tensors` and `keys` (after `{architecture}.`) added:
    what the check reads, not a model that loads."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_embedding_length(SMALL_WIDTH)
    writer.add_head_count(SMALL_HEADS)
    for key, value in (keys or {}).items():
        add_key(writer, f"{architecture}.{key}", value)
    base = {"token_embd.weight": (8, SMALL_WIDTH), "blk.0.attn_q.weight": (SMALL_WIDTH, SMALL_WIDTH),
            "output_norm.weight": (SMALL_WIDTH,)}
    for name, shape in base.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    for name, values in (tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
