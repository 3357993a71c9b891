"""Tiny random models of the families beside Llama, built in-process at the tiny Llama's vocabulary:
a Qwen2 (the family's biases, explicit head size and untied output layer), a Qwen3 (q/k norms,
heads wider than hidden / heads), a Gemma 3 (sliding and full layers, sandwich and (1 + w)
norms, a GELU gate) and a Phi-3 (q/k/v and gate/up fused)."""

from __future__ import annotations

import torch

from tests.helpers.tiny import TINY_VOCAB


def _tiny_qwen(config_class, model_class, heads: int, kv_heads: int, head_dim: int, seed: int, dtype: torch.dtype,
               layers: int, overrides: dict):
    """A random Qwen-family model (hidden 128, explicit head_dim, rotary base 1e6, an untied output layer)."""
    torch.manual_seed(seed)
    config = config_class(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                          max_position_embeddings=512, tie_word_embeddings=False, rope_parameters={
                              "rope_type": "default", "rope_theta": 1e6}, **overrides)
    return model_class(config).to(dtype).eval()


def make_tiny_qwen2(heads: int = 7, kv_heads: int = 1, head_dim: int = 64, seed: int = 0,
                    dtype: torch.dtype = torch.float32, layers: int = 2, sharpen: float = 40.0, **overrides):
    """A random Qwen2 (hidden 128, explicit head_dim) with non-zero q/k/v biases and an untied output layer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = _tiny_qwen(Qwen2Config, Qwen2ForCausalLM, heads, kv_heads, head_dim, seed, dtype, layers, overrides)
    with torch.no_grad():
        for layer in model.model.layers:
            for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                m.bias.normal_(0, 0.5)
        model.lm_head.weight.mul_(sharpen)  # varied greedy continuations, not ties
    return model


def make_tiny_qwen3(heads: int = 4, kv_heads: int = 2, head_dim: int = 64, seed: int = 0,
                    dtype: torch.dtype = torch.float32, layers: int = 2, sharpen: float = 40.0, **overrides):
    """A random Qwen3 (hidden 128; heads of `head_dim`, wider than hidden / heads by default, as the
    real ones are) with q/k norms of varied weights and an untied output layer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = _tiny_qwen(Qwen3Config, Qwen3ForCausalLM, heads, kv_heads, head_dim, seed, dtype, layers, overrides)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(1.0, 0.3)
            layer.self_attn.k_norm.weight.normal_(1.0, 0.3)
        model.lm_head.weight.mul_(sharpen)  # varied greedy continuations, not ties
    return model


def make_tiny_gemma3(seed: int = 0, dtype: torch.dtype = torch.float32, window: int = 8, sharpen: float = 4.0):
    """A random Gemma 3 (text) of three layers, the first and last sliding over `window` tokens (the
    sliding layers' rotary base 10,000, the full one's 1,000,000), 4 query heads over 2 of 16, every
    norm (the sandwich norms, q/k norms) of varied (1 + w) weights, a tied head."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=window, max_position_embeddings=512,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    model = Gemma3ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.normal_(0.0, 0.3)
        model.model.embed_tokens.weight.mul_(sharpen)  # varied greedy continuations, not ties
    return model


def long_rope_parameters(original: int, pairs: int = 8, seed: int = 0) -> dict:
    """A Phi-3 config's LongRoPE (its 128k models'): random short and long factors for `pairs` pairs of a
    head's dimensions (the long ones larger, as Phi-3.5's), switching past `original` tokens."""
    generator = torch.Generator().manual_seed(seed)
    short = (1.0 + torch.rand(pairs, generator=generator) * 0.2).tolist()
    long = (1.0 + torch.rand(pairs, generator=generator) * 30.0).tolist()
    return {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original}  # (Phi3Config also wants it as its own field)


def make_tiny_phi3(seed: int = 0, dtype: torch.dtype = torch.float32, sharpen: float = 4.0, unfused: bool = True,
                   long_rope: int | None = None, partial: float = 1.0):
    """A random Phi-3 of two layers, 4 query heads over 2 of 16, q/k/v and gate/up fused as its model
    holds them, then split as the loader splits them (`unfuse`; `unfused=False`: left fused); `long_rope`:
    with LongRoPE switching past that many tokens (`long_rope_parameters`), left as transformers makes it;
    `partial`: the part of each head its rotary embedding turns (Phi-4-mini's 0.75)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    from specdraft.backend.family import family_of
    from specdraft.models.fused import unfuse

    torch.manual_seed(seed)
    pairs = int(16 * partial) // 2
    rope = {} if long_rope is None else {"rope_parameters": long_rope_parameters(long_rope, pairs, seed=seed),
                                         "original_max_position_embeddings": long_rope}
    if partial != 1.0:
        rope["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, **rope.get("rope_parameters", {}),
                                   "partial_rotary_factor": partial}
    config = Phi3Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, **rope)
    model = Phi3ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.normal_(1.0, 0.3)
        model.lm_head.weight.mul_(sharpen)  # varied greedy continuations, not ties
    if unfused:
        unfuse(model, family_of(config))
    return model
