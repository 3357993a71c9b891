"""Tiny GGUF files as llama.cpp writes them: random weights quantised as gguf does (`random_blocks`),
a model's projections as blocks with the model then holding the file's values (`write_gguf`), a tiny
model's file that loads whole through specdraft (its config as metadata, a byte-level tokenizer:
`write_model_gguf`), Llama 3's rotary factors as llama.cpp's converter computes them
(`llama3_rope_freqs`), and a file of a few tensors and keys for what the check refuses (`write_small`)."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import torch

from benchmarks.cpu.kind_files import byte_tokenizer, quantize
from specdraft.backend import native as blocks
from specdraft.backend.family import family_of


def random_blocks(rng, kind: int, rows: int, width: int) -> np.ndarray:
    """Random weights quantised (as gguf does, where it does: `kind_files.quantize`): [rows, row bytes] uint8."""
    return quantize(rng.standard_normal((rows, width)).astype(np.float32) * 0.1, blocks.NAMES[kind])


def _llama_cpp_order(weights: np.ndarray, heads: int) -> np.ndarray:
    """The row order llama.cpp's converter writes q (k) in (what transformers undoes on loading)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def write_gguf(model, path, projection_type: str = "Q4_1", head_type: str = "Q8_0",
               types: dict[str, str] | None = None, extra=None) -> None:
    """The model's embedding, output layer and projections as a GGUF of these types (`types`: a type
    for some parts, e.g. {"attn_v": "Q8_0"}), as llama.cpp writes its family (q/k rows interleaved where
    `gguf_interleaved_qk`; biases and norms as float32). Then the model's weights are set to the
    file's dequantised values, as transformers would load them. `extra(writer)`, where given, adds
    what else the file holds (metadata, a tokenizer, more tensors: `write_model_gguf`)."""
    family = family_of(model.config)
    writer = gguf.GGUFWriter(str(path), family.model_type)
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors = {"token_embd.weight": (model.model.embed_tokens, head_type), "output.weight": (model.lm_head, head_type)}
    for i, layer in enumerate(model.model.layers):
        for module, part in names.items():
            parent = layer.self_attn if part.startswith("attn") else layer.mlp
            tensors[f"blk.{i}.{part}.weight"] = (getattr(parent, module), (types or {}).get(part, projection_type))
    with torch.no_grad():
        for name, (module, type_name) in tensors.items():
            qtype = getattr(gguf.GGMLQuantizationType, type_name)
            weight = module.weight.detach().float().numpy()
            heads = {"attn_q": family.heads, "attn_k": family.kv_heads}.get(name.split(".")[-2])
            heads = heads if family.gguf_interleaved_qk else None
            stored = _llama_cpp_order(weight, heads) if heads else weight
            quantized = quantize(stored, type_name)
            writer.add_tensor(name, quantized, raw_shape=quantized.shape, raw_dtype=qtype)
            values = gguf.quants.dequantize(quantized, qtype)
            if heads:  # undo the order as transformers does
                values = values[blocks.rotary_order(values.shape[0], heads)]
            module.weight.copy_(torch.from_numpy(values))
            if getattr(module, "bias", None) is not None:
                writer.add_tensor(name.replace(".weight", ".bias"), module.bias.detach().float().numpy())
    _write_norms(writer, model)
    if extra is not None:
        extra(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_norms(writer, model) -> None:
    norms = {"output_norm.weight": model.model.norm}
    for i, layer in enumerate(model.model.layers):
        norms |= {f"blk.{i}.attn_norm.weight": layer.input_layernorm, f"blk.{i}.ffn_norm.weight": layer.post_attention_layernorm}
        if hasattr(layer.self_attn, "q_norm"):  # Qwen3's, as llama.cpp's converter writes them
            norms |= {f"blk.{i}.attn_q_norm.weight": layer.self_attn.q_norm,
                      f"blk.{i}.attn_k_norm.weight": layer.self_attn.k_norm}
    for name, norm in norms.items():
        writer.add_tensor(name, norm.weight.detach().float().numpy().copy())


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
        byte_tokenizer(writer, model.config.vocab_size)
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
    writer.add_key_length(family.head_dim)
    writer.add_value_length(family.head_dim)
    writer.add_layer_norm_rms_eps(family.norm_eps)
    writer.add_vocab_size(config.vocab_size)


def add_key(writer: gguf.GGUFWriter, key: str, value: object) -> None:
    """A scalar key-value of the GGUF type a Python value has (bool, int, float, str)."""
    kinds = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32,
             str: gguf.GGUFValueType.STRING}
    writer.add_key_value(key, value, kinds[type(value)])


SMALL_WIDTH, SMALL_HEADS = 64, 4  # a head of 16: rope_freqs holds 8 factors


def write_small(path: Path, architecture: str = "llama", tensors: dict[str, np.ndarray] | None = None,
                keys: dict[str, object] | None = None, projection: str = "attn_q") -> Path:
    """A GGUF of a few float32 tensors a family's loader reads (an embedding, a projection of layer 0
    named `projection`, a norm), its width and heads in its metadata, then `tensors` and `keys` (after
    `{architecture}.`) added: what the check reads, not a model that loads."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_embedding_length(SMALL_WIDTH)
    writer.add_head_count(SMALL_HEADS)
    for key, value in (keys or {}).items():
        add_key(writer, f"{architecture}.{key}", value)
    base = {"token_embd.weight": (8, SMALL_WIDTH), f"blk.0.{projection}.weight": (SMALL_WIDTH, SMALL_WIDTH),
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
