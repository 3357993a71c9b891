"""Our own forward pass for Llama-family models (Llama 2/3.x, SmolLM2), over the transformers
model's own modules and weights: embedding, rotary embedding, norms, projections and MLPs are called
as they are; the layer loop, the KV writes and attention are ours.

Why not the stock forward: it takes any subset of the decoder layers (draft models that skip layers),
runs its activations in a chosen dtype (other than the weights' for int8 draft copies), takes a boolean mask
built on the device, pays less Python per layer, and computes only a batch's real tokens: given
`real`, the flat indices of the real tokens in the padded [batch, T] input, every per-token part
(embedding, norms, projections, MLPs, output layer) runs on those alone and only attention sees
the padded layout. A verify step whose rows draft different lengths then costs its tokens, not
batch x the longest draft. Its logits equal the stock model's (`tests/test_backend.py`). Other
architectures run the stock forward (`RowModel` decides).

On CPU (`fused`), passes of a few tokens run compiled: float32 layers and int8 draft copies (float32
activations) as numba kernels, the whole layer stack with attention and cache writes in one call
(`numba_layers.NumbaLayers`); other dtypes as inductor's compiled parts around torch's attention
(`fused.FusedLayers`).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specdraft.backend.fused import FusedLayers
from specdraft.backend.numba_layers import NumbaLayers

_FAMILY = ("llama",)


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is a decoder this forward reproduces exactly: a Llama-architecture causal LM
    with full attention (no sliding window) and the standard module layout."""
    config = model.config
    if getattr(config, "model_type", None) not in _FAMILY or getattr(config, "sliding_window", None):
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not len(layers) or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return False
    layer = layers[0]
    attention = getattr(layer, "self_attn", None)
    return all(hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and all(
        hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp"))


class LlamaForward:
    """model: a Llama-family causal LM; layers: indices of the decoder layers to run (default all);
    dtype: the activations' dtype (default the model's)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 fused: bool = False) -> None:
        assert supports(model), type(model).__name__
        config = model.config
        self.model = model
        indices = range(len(model.model.layers)) if layers is None else layers
        self.layers = [model.model.layers[i] for i in indices]
        self.dtype = dtype or model.model.embed_tokens.weight.dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # fused: the per-token parts of decode and verify passes compiled for CPU, where they apply:
        # numba's kernels for float32 activations (float32 or int8 weights), inductor's for the others (bf16).
        self.fused: NumbaLayers | FusedLayers | None = None
        if fused and NumbaLayers.applies(model, self.layers, self.dtype):
            self.fused = NumbaLayers(model, self.layers, self.head_dim, self.num_heads, self.num_kv_heads)
        elif fused and FusedLayers.applies(model, self.layers, self.dtype):
            self.fused = FusedLayers(model, self.layers, self.dtype, self.head_dim, self.num_heads, self.num_kv_heads)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache,
                 logits_at: torch.Tensor | None = None, real: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [batch, T]; mask: [batch, 1, T, kv] bool, True where a query may look;
        cache: a `RowKVCache` prepared for this pass (its layer i is the i-th layer run here);
        logits_at: [batch] the one position per row to return logits for, or None for all T;
        real: [N] flat indices into [batch, T] of the tokens to compute (None: all). Padding tokens
        write zero keys and values, or none, past their row's tokens (never committed, never seen)
        and get zero logits.
        Returns logits [batch, T or 1, vocab] (float32)."""
        batch, steps = input_ids.shape
        assert real is None or logits_at is None, "packed passes return every real token's logits"
        ids = input_ids.reshape(-1) if real is None else input_ids.reshape(-1)[real]
        x = self.model.model.embed_tokens(ids).to(self.dtype)  # [N, hidden]
        cos, sin = self.model.model.rotary_emb(x, positions)
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        # Once compiling has failed (no compiler here), the eager layers, not the fused functions run eagerly.
        fused = self.fused if self.fused is not None and not self.fused.failed and self.fused.takes(len(ids)) else None
        if fused is not None:  # rotary embedding inside the fused layers, on the computed tokens' rows
            cos, sin = (c.reshape(batch * steps, -1) if real is None else c.reshape(batch * steps, -1)[real]
                        for c in (cos, sin))
        if isinstance(fused, NumbaLayers):  # every layer in one call, attention and cache writes included
            flat = torch.arange(batch * steps) if real is None else real  # [N] into [batch * T]
            x = fused.stack(x, cos, sin, flat // steps, positions.reshape(-1)[flat],
                            mask[:, 0].reshape(batch * steps, -1)[flat], cache)
        else:
            x = self._layers(x, cos, sin, mask, cache, real, batch, steps, fused)
        if logits_at is not None:
            x = x.view(batch, steps, -1).gather(1, logits_at[:, None, None].expand(batch, 1, x.shape[-1])).view(batch, -1)
        logits = (fused.head(x) if fused is not None
                  else self.model.lm_head(self.model.model.norm(x).to(self.dtype)).float())  # [N or batch, vocab]
        if logits_at is not None:
            return logits.view(batch, 1, -1)
        if real is not None:
            logits = logits.new_zeros(batch * steps, logits.shape[-1]).index_copy_(0, real, logits)
        return logits.view(batch, steps, -1)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor, cache,
                real: torch.Tensor | None, batch: int, steps: int, fused: FusedLayers | None) -> torch.Tensor:
        """The decoder layers layer by layer: attention by torch, the rest fused (inductor's parts) or eager."""
        qkv = None if fused is None else fused.before_attention(0, x, cos, sin)  # then one call between attentions
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            if fused is not None:
                q, k, v = (self._heads(y, real, batch, steps, n)
                           for y, n in zip(qkv, (self.num_heads, self.num_kv_heads, self.num_kv_heads)))
            else:
                h = layer.input_layernorm(x).to(self.dtype)
                q = self._heads(attention.q_proj(h), real, batch, steps, self.num_heads)
                k = self._heads(attention.k_proj(h), real, batch, steps, self.num_kv_heads)
                v = self._heads(attention.v_proj(h), real, batch, steps, self.num_kv_heads)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)  # [batch, heads, T, head_dim]
            keys, values = cache.update(k, v, i)  # [batch, kv_heads, kv, head_dim]
            out = F.scaled_dot_product_attention(q, keys.to(self.dtype), values.to(self.dtype), attn_mask=mask,
                                                 enable_gqa=self.num_kv_heads != self.num_heads)
            out = out.transpose(1, 2).reshape(batch * steps, -1)  # [batch * T, heads * head_dim]
            out = out if real is None else out[real]
            if fused is not None and i + 1 < len(self.layers):
                x, *qkv = fused.between(i, x, out, cos, sin)
            elif fused is not None:
                x = fused.after_attention(i, x, out)
            else:
                x = x + attention.o_proj(out).to(self.dtype)
                x = x + layer.mlp(layer.post_attention_layernorm(x).to(self.dtype)).to(self.dtype)
        return x

    def _heads(self, y: torch.Tensor, real: torch.Tensor | None, batch: int, steps: int, heads: int) -> torch.Tensor:
        """[N, heads * head_dim] projections -> [batch, heads, T, head_dim], zeros at padding."""
        if real is not None:
            y = y.new_zeros(batch * steps, y.shape[-1]).index_copy_(0, real, y)
        return y.view(batch, steps, heads, self.head_dim).transpose(1, 2).to(self.dtype)
