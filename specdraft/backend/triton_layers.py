"""`TritonLayers`: a decoder stack (a `Family` of `family.FAMILIES`) run by `triton_kernels`, so
that a token's logits and the keys and values it writes are bitwise the same whatever pass computes
them (a plain step, a verify pass of any width, a prefill chunk, alone or beside other rows, at any
KV length). Used on CUDA (bf16 by default), where the libraries' kernels change their reductions
with the row count; on CPU only under Triton's interpreter (tests). Called as `layers.EagerLayers`
is (`takes`, `stack`, `head`).

Five launches a layer (six to nine where a narrow weight splits its in-features): q/k/v with the
input norm fused in, rotary embedding + the cache write, attention (chunks, then their merge), the
output projection with the residual, gate/up with the norm fused in, down with SiLU(gate) * up
fused in and the residual. Attention reads each token's position from the device and ignores the
pass's mask, so captured graphs need not vary with the KV length (`reads_lengths`).

Projections may be float (the activations' dtype) or int8 with per-output scales (the draft copy's
`WeightOnlyInt8Linear`: half the bytes of bf16 a step reads). How the kernels launch (the linear's
tiles, programmatic dependent launch) is fixed at load from `triton_kernels.CHOICE`, and each weight's
tiling computed once from its shape.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from specdraft.backend.family import Family
from specdraft.backend.layers import Pass
from specdraft.backend.weights import joined_projection, layer_linears, model_device, plain_linear, silu_mlp


def unavailable(model: torch.nn.Module, layers: Sequence[torch.nn.Module], dtype: torch.dtype,
                family: Family) -> str | None:
    """Why these layers (of a model described by `family`) cannot run on the Triton kernels (None: they can)."""
    device = model_device(model)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"the Triton kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the Triton kernels take bfloat16, float16 or float32 activations, not {dtype}"
    head_dim = family.head_dim
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"the head dimension must be a power of two >= 16, got {head_dim}"
    if family.norm_offset or family.sandwich_norms or family.local_rope:
        return "the kernels have no (1 + w) or sandwich norms, nor a rotary base per layer type (Gemma's), yet"
    if family.qk_norm:
        return "the kernels have no per-head q/k norms (Qwen3's) yet"
    if family.rotated != head_dim:
        return f"the kernels have no rotary embedding over part of a head ({family.rotated} of {head_dim}) yet"
    if family.window is not None:
        return f"the kernels have no sliding window ({family.window} tokens) yet"
    if not all(silu_mlp(layer.mlp) for layer in layers):
        return "the MLPs must be SiLU-gated"
    linears = [m for m in layer_linears(model, layers) if m is not None]
    if any(not plain_linear(m) or m.weight.dtype not in (dtype, torch.int8) for m in linears):
        return f"every projection must be a linear layer with {dtype} or int8 weights"
    return _kernels_fail(device, dtype)


@functools.cache
def _kernels_fail(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the kernels do not run on this device (None: each ran once on small tensors, compiled for
    the installed Triton and device)."""
    from specdraft.backend import triton_kernels as k

    try:
        x = torch.ones(2, 64, dtype=dtype, device=device)
        y = k.linear(x, torch.ones(32, 32, dtype=dtype, device=device), act=True, residual=x[:, :32],
                     norm=None, out_dtype=dtype)
        q = k.linear(x, torch.ones(64, 64, dtype=dtype, device=device), norm=(x[0], 1e-6))
        cache = torch.zeros(1, 1, 32, 16, dtype=dtype, device=device)
        where = torch.zeros(2, dtype=torch.int32, device=device)
        q = k.rope_write(q[:, :48], x[:, :16], x[:, :16], where, where + 1, cache, cache.clone(), 1, 1, 16)
        k.attention(q, cache, cache, where, where + 1, 1, 1, 16)
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert torch.isfinite(y).all()
    except Exception as exc:  # noqa: BLE001 - any failure means: run the torch modules instead
        why = f"the Triton kernels failed on this device: {type(exc).__name__}: {exc}".splitlines()[0]
        warnings.warn(why + "; running the torch modules (outputs may then depend on the pass in bf16)",
                      RuntimeWarning, stacklevel=3)
        return why
    return None


@dataclass(frozen=True)
class _Projection:
    """A (joined) linear as the kernels take it: its weight, bias and int8 scales, and its tiling."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scales: torch.Tensor | None
    tiled: object  # triton_kernels.Tiling


class TritonLayers:
    """The decoder layers and head of a model (described by `family`) on `triton_kernels`, q/k/v and
    gate/up joined with their biases; activations in `dtype`; `choice`: how the kernels launch
    (default `triton_kernels.CHOICE`; programmatic dependent launch only where the device has it)."""

    max_tokens = None
    reads_lengths = True

    def __init__(self, model: torch.nn.Module, layers: Sequence[torch.nn.Module], dtype: torch.dtype,
                 family: Family, choice=None) -> None:
        from specdraft.backend import triton_kernels

        self.kernels = triton_kernels
        self.choice = choice or triton_kernels.CHOICE
        self.pdl = self.choice.pdl and triton_kernels.pdl_available(model_device(model))
        self.dtype, self.shape, eps = dtype, family.shape, family.norm_eps
        self._layers = []
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            self._layers.append(dict(
                input_norm=(layer.input_layernorm.weight, eps), qkv=self._projection([a.q_proj, a.k_proj, a.v_proj]),
                o=self._projection([a.o_proj]), post_norm=(layer.post_attention_layernorm.weight, eps),
                gate_up=self._projection([mlp.gate_proj, mlp.up_proj]), down=self._projection([mlp.down_proj])))
        self.chunk = triton_kernels.chunk_for(model.config.max_position_embeddings)
        norm = model.model.norm
        self._head = ((norm.weight, eps), self._projection([model.lm_head]))

    def _projection(self, modules: list[torch.nn.Module]) -> _Projection:
        if len(modules) == 1:
            m = modules[0]
            weight, bias, scales = m.weight, getattr(m, "bias", None), getattr(m, "scales", None)
        else:
            weight, bias, scales = joined_projection(modules)
        return _Projection(weight, bias, scales, self.choice.tiling(*weight.shape))

    def _linear(self, x: torch.Tensor, p: _Projection, **options) -> torch.Tensor:
        return self.kernels.linear(x, p.weight, p.bias, scales=p.scales, tiled=p.tiled, pdl=self.pdl, **options)

    def takes(self, tokens: int) -> bool:
        return True

    def stack(self, p: Pass) -> torch.Tensor:
        heads, kv_heads, head_dim = self.shape
        k = self.kernels
        flat = torch.arange(p.batch * p.steps, device=p.x.device) if p.real is None else p.real  # [N] into [batch, T]
        slots = (flat // p.steps).to(torch.int32)  # [N] row of the window
        positions = p.positions.reshape(-1)[flat].to(torch.int32).contiguous()  # [N]
        cos, sin = p.flat(p.cos).contiguous(), p.flat(p.sin).contiguous()  # [N, head_dim]
        keys, values = p.cache.window_buffers()
        x = p.x.contiguous()
        for i, w in enumerate(self._layers):
            qkv = self._linear(x, w["qkv"], norm=w["input_norm"])
            q = k.rope_write(qkv, cos, sin, slots, positions, keys[i], values[i], heads, kv_heads, head_dim, pdl=self.pdl)
            attended = k.attention(q, keys[i], values[i], slots, positions, heads, kv_heads, head_dim, self.chunk,
                                   pdl=self.pdl)
            x = self._linear(attended, w["o"], residual=x)
            gate_up = self._linear(x, w["gate_up"], norm=w["post_norm"])
            x = self._linear(gate_up, w["down"], act=True, residual=x)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab]: the final norm fused into the output layer."""
        norm, projection = self._head
        return self._linear(x.contiguous(), projection, norm=norm, out_dtype=torch.float32)
