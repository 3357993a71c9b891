"""The ways `OwnForward` runs a pass's decoder layers and output head, one class each, alike to call:
`takes(tokens, width)` (whether it runs a pass of that many tokens, `width` a row), `stack(pass) ->
stream` (every layer, writing the pass's keys and values into the cache), `head(stream) -> logits`;
`max_tokens`, the most tokens one of its calls computes (None: any).

- `EagerLayers` (here): the model's own torch modules, layer by layer, attention by torch's SDPA.
- `NumbaLayers` (`numba_layers/`): on CPU, float32, GGUF-block or int8 weights, numba kernels for
  the whole stack, attention included, in one call.
- `InductorLayers` (`inductor.py`): on CPU, other float dtypes, inductor's compiled parts around
  torch's attention (`attend_by_sdpa`, as here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specdraft.backend.family import Family


@dataclass(frozen=True)
class Pass:
    """One forward pass as the layers see it: x [N, hidden], the stream of the N tokens it computes
    (given `real`, their flat indices into the padded [batch, T] input; None: all of it); cos, sin
    [batch, T, head_dim], the rotary embedding; positions [batch, T]; mask [batch, 1, T, kv] bool,
    True where a query may look; cache, a `KVCache` prepared for the pass; window_mask: `mask` over a
    sliding window only, for the layers that slide (None where none does); local_rotary: the sliding
    layers' (cos, sin), where their rotary embedding has a base of its own (`Family.local_rope`)."""

    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    cache: object
    real: torch.Tensor | None
    batch: int
    steps: int
    window_mask: torch.Tensor | None = None
    local_rotary: tuple[torch.Tensor, torch.Tensor] | None = None

    def mask_of(self, slides: bool) -> torch.Tensor:
        """The mask a layer attends by: over its sliding window where it `slides`."""
        return self.window_mask if slides else self.mask

    def rotary_of(self, slides: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The (cos, sin) a layer rotates by: the sliding layers' own where they have one."""
        return self.local_rotary if slides and self.local_rotary is not None else (self.cos, self.sin)

    def flat(self, t: torch.Tensor) -> torch.Tensor:
        """[batch, T, ...] -> the computed tokens' rows [N, ...]."""
        rows = t.reshape(self.batch * self.steps, *t.shape[2:])
        return rows if self.real is None else rows[self.real]

    def heads(self, y: torch.Tensor, heads: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
        """[N, heads * head_dim] projections -> [batch, heads, T, head_dim], zeros at padding."""
        if self.real is not None:
            y = y.new_zeros(self.batch * self.steps, y.shape[-1]).index_copy_(0, self.real, y)
        return y.view(self.batch, self.steps, heads, head_dim).transpose(1, 2).to(dtype)


def rotate_part(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary embedding of q and k over each head's first cos.shape[-1] dimensions (all of it,
    or a partial rotary's part, Phi-3's `apply_rotary_pos_emb`: the rest as they are)."""
    turned = cos.shape[-1]
    if turned == q.shape[-1]:
        return apply_rotary_pos_emb(q, k, cos, sin)
    q_turned, k_turned = apply_rotary_pos_emb(q[..., :turned], k[..., :turned], cos, sin)
    return torch.cat([q_turned, q[..., turned:]], dim=-1), torch.cat([k_turned, k[..., turned:]], dim=-1)


def attend_by_sdpa(p: Pass, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype,
                   gqa: bool, slides: bool) -> torch.Tensor:
    """Write the layer's new keys and values ([batch, kv_heads, T, head_dim]) into the cache, then
    attention of q [batch, heads, T, head_dim] over the rows' entries (those of its sliding window
    where it `slides`) by torch's SDPA: [N, heads * head_dim]. (`numba_layers.attend` is the CPU
    step's, by spans.)"""
    keys, values = p.cache.update(k, v, layer)  # [batch, kv_heads, kv, head_dim]
    out = F.scaled_dot_product_attention(q, keys.to(dtype), values.to(dtype), attn_mask=p.mask_of(slides),
                                         enable_gqa=gqa)
    out = out.transpose(1, 2).reshape(p.batch * p.steps, -1)  # [batch * T, heads * head_dim]
    return out if p.real is None else out[p.real]


class EagerLayers:
    """The model's decoder layers and head as its own modules (their biases and q/k norms included),
    activations in `dtype`; `family` gives the head counts and size."""

    max_tokens = None

    def __init__(self, model: torch.nn.Module, layers: Sequence[torch.nn.Module], dtype: torch.dtype,
                 family: Family) -> None:
        self.model, self.layers, self.dtype = model, list(layers), dtype
        self.num_heads, self.num_kv_heads, self.head_dim = family.shape
        self.qk_norm = family.qk_norm
        self.slides = [family.slides(layer.self_attn.layer_idx) for layer in self.layers]
        self.sandwich = family.sandwich_norms

    def takes(self, tokens: int, width: int) -> bool:
        return True

    def stack(self, p: Pass) -> torch.Tensor:
        x = p.x
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            h = layer.input_layernorm(x).to(self.dtype)
            q = p.heads(attention.q_proj(h), self.num_heads, self.head_dim, self.dtype)
            k = p.heads(attention.k_proj(h), self.num_kv_heads, self.head_dim, self.dtype)
            v = p.heads(attention.v_proj(h), self.num_kv_heads, self.head_dim, self.dtype)
            if self.qk_norm:  # each head's own, before the rotary embedding
                q, k = attention.q_norm(q).to(self.dtype), attention.k_norm(k).to(self.dtype)
            q, k = rotate_part(q, k, *p.rotary_of(self.slides[i]))  # [batch, heads, T, head_dim]
            out = attend_by_sdpa(p, i, q, k, v, self.dtype, self.num_kv_heads != self.num_heads, self.slides[i])
            x = self._after_attention(layer, x, attention.o_proj(out).to(self.dtype))
        return x

    def _after_attention(self, layer: torch.nn.Module, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The stream after the attention's output (projected) and the MLP joined it: each normed first
        where the family has sandwich norms."""
        if not self.sandwich:
            x = x + attended
            return x + layer.mlp(layer.post_attention_layernorm(x).to(self.dtype)).to(self.dtype)
        x = x + layer.post_attention_layernorm(attended).to(self.dtype)
        mlp = layer.mlp(layer.pre_feedforward_layernorm(x).to(self.dtype)).to(self.dtype)
        return x + layer.post_feedforward_layernorm(mlp).to(self.dtype)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab]."""
        return self.model.lm_head(self.model.model.norm(x).to(self.dtype)).float()
