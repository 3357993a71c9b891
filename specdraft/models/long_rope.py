"""LongRoPE (Phi-3's 128k models, Phi-3.5-mini): two sets of rotary frequency factors, the short ones for a
context within the model's original one (`original_max_position_embeddings`, 4096), the long ones past it,
and an attention factor that scales cos and sin.

Transformers switches between the two sets by the longest position of each pass, so a token's rotation
would depend on the other rows of a batch and on how a prompt is cut into chunks: no pass could then
stand in for another. llama.cpp chooses once, by the context it serves. specdraft chooses as llama.cpp
does, once for the context served (`use_context`): the short factors where it is within the original
context (what a model loads with, and what a runtime serves unless `--max-model-len` asks for more: within
it, transformers' rotation exactly), the long ones for a longer context, on the rotary module's
frequencies, from which every path (eager, numba, native, inductor, Triton) takes cos and sin.

A GGUF holds them as llama.cpp's converter writes them (`phi3.rope.scaling.original_context_length`,
`phi3.rope.scaling.attn_factor`, and the float32 tensors `rope_factors_short` and `rope_factors_long`),
which transformers' GGUF config leaves unread: `rope_parameters_of` reads them into the config's
`rope_parameters`, as the model's Hugging Face config holds them."""

from __future__ import annotations

import numpy as np
import torch

from specdraft.backend.family import LONG_ROPE


def original_context(config) -> int | None:
    """The original context of a LongRoPE model (its short factors' reach), None for any other model."""
    rope = getattr(config, "rope_parameters", None) or {}
    return int(rope["original_max_position_embeddings"]) if rope.get("rope_type") == "longrope" else None


def use_context(model: torch.nn.Module, context: int | None = None) -> None:
    """Fix a LongRoPE model's rotary frequencies for serving `context` tokens (None: its original context):
    the short factors within its original context, the long ones past it (the attention factor is the same
    either way). Nothing for other models. Transformers' switch per pass is turned off: the module's
    frequencies are fixed."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = getattr(model, "config", None)
    original = original_context(config)
    if original is None:
        return
    rotary = model.model.rotary_emb
    context = original if context is None else context
    frequencies, scaling = ROPE_INIT_FUNCTIONS["longrope"](config, rotary.inv_freq.device, seq_len=context)
    assert frequencies.shape == rotary.inv_freq.shape and scaling == rotary.attention_scaling
    with torch.no_grad():
        rotary.inv_freq.copy_(frequencies)
        rotary.original_inv_freq.copy_(frequencies)
    rotary.rope_type = "default"  # its forward then rotates by inv_freq as set, whatever a pass's positions


def rope_parameters_of(reader, config) -> dict | None:
    """A GGUF's LongRoPE (`reader`: gguf's `GGUFReader` of it) as a config's `rope_parameters` (None where
    the file has none): its short and long factors, original context and attention factor, beside the
    config's rotary base."""
    factors = {t.name: np.asarray(t.data, np.float32).tolist() for t in reader.tensors if t.name in LONG_ROPE}
    if not factors:
        return None
    architecture = reader.get_field("general.architecture").contents()

    def value(key: str):
        field = reader.get_field(f"{architecture}.{key}")
        return None if field is None else field.contents()

    short, long = (factors[name] for name in LONG_ROPE)
    return {"rope_type": "longrope", "rope_theta": config.rope_parameters["rope_theta"], "short_factor": short,
            "long_factor": long, "original_max_position_embeddings": int(value("rope.scaling.original_context_length")),
            "attention_factor": float(value("rope.scaling.attn_factor") or 1.0)}
