"""`InductorLayers`: a decoder layer's per-token work compiled into a few CPU kernels by inductor
(the families of `family.FAMILIES`), for activations numba's kernels do not take (bf16; int8 draft copies computing in
bf16). One of the ways to run a pass's layers (`specdraft.backend.layers`).

On CPU a decode step is bound by reading the weights, and the eager layer spends much of it
elsewhere: dozens of small ops per layer (norms, rotary embedding, activation, residual adds, views)
each paying Python and dispatch, and BLAS matrix-vector paths that read the weights well below the
rate memory allows (`benchmarks/results/cpu/cpu_profile.md`). Here a layer's per-token work is
compiled by inductor's CPU backend: norm, q/k/v projections (one joined weight) and rotary
embedding before attention; output projection, residual, norm, MLP (gate/up joined) and residual
after it. Layer i's end and layer i + 1's start are one call; the final norm and output layer
another. Attention and the cache writes are torch's, as the eager layers run them
(`layers.attend_by_sdpa`).

A projection is written as one reduction over each weight row per token (`(W * x[i]).sum(-1)`):
inductor fuses a pass's reductions into one vectorised loop that reads the weights once for all its
tokens, near memory speed. Int8 draft copies call torch's int8 kernel instead
(`WeightOnlyInt8Linear`'s). The arithmetic is the eager layer's, summed in another order: logits
agree to float rounding (`tests/backend/test_inductor.py`) and greedy output equals Hugging Face `generate`'s
on every test and benchmark prompt.

The weights are arguments, not captured constants, so the layers of a model share one graph per
token count (1 to `MAX_TOKENS`; larger passes run the eager layers, where BLAS products win). All
are compiled when the layers are built (seconds with inductor's disk cache warm, a minute the first
time on a machine). If compiling fails, that call runs the same functions eagerly, with a warning,
and the layers take no pass from then on (`OwnForward` runs its eager layers).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from specdraft.backend.family import Family, family_of
from specdraft.backend.layers import Pass, attend_by_sdpa
from specdraft.backend.weight_only_int8 import WeightOnlyInt8Linear
from specdraft.backend.weights import joined_projection, layer_linears, model_device, plain_linear, projection, silu_mlp

MAX_TOKENS = 8  # passes of up to this many tokens run here (a graph per count)


def _linear(x: torch.Tensor, projection: tuple) -> torch.Tensor:
    """x [N, in] -> [N, out]: one reduction over each weight row per token, which inductor fuses into
    one vectorised pass that reads the weights once for all N tokens. projection: (weight [out, in],
    bias [out] or None, scales [out] of int8 weights or None)."""
    weight, bias, scales = projection
    if scales is not None:  # int8 weights: torch's int8 kernel on bf16 rows (`WeightOnlyInt8Linear`)
        out = torch._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), weight, scales).to(x.dtype)
    else:
        out = torch.stack([(weight * x[i]).sum(-1) for i in range(x.shape[0])])
    return out if bias is None else out + bias


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Transformers' `LlamaRMSNorm`: computed in float32, scaled in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [N, heads, head_dim] at cos/sin [N, rotated] (transformers' `rotate_half`) over
    each head's first `rotated` dimensions (all of it, or a partial rotary's part: the rest as they are)."""
    turned, kept = x[..., : cos.shape[-1]], x[..., cos.shape[-1] :]
    half = turned.shape[-1] // 2
    rotated = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
    out = turned * cos[:, None] + rotated * sin[:, None]
    return out if kept.shape[-1] == 0 else torch.cat((out, kept), dim=-1)


# Each part also returns the inputs of its projections (normed rows, the MLP's activations): as
# outputs they are stored once, where inductor would otherwise recompute them inside every weight
# row's reduction (several times slower at a few tokens). The callers keep only the first outputs.

def _before_attention(x, cos, sin, norm, eps: float, qkv: tuple, head_norms: tuple | None, head_dim: int, heads: int,
                      kv_heads: int):
    """x [N, hidden] -> q [N, heads * head_dim], k, v [N, kv_heads * head_dim] (q, k normed per head
    where `head_norms` gives their weights, then rotated), normed x."""
    h = _rms_norm(x, norm, eps)
    n = x.shape[0]
    q, k, v = _linear(h, qkv).split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.reshape(n, heads, head_dim), k.reshape(n, kv_heads, head_dim)
    if head_norms is not None:
        q, k = _rms_norm(q, head_norms[0], eps), _rms_norm(k, head_norms[1], eps)
    return _rotate(q, cos, sin).reshape(n, -1), _rotate(k, cos, sin).reshape(n, -1), v, h


def _after_attention(x, attended, o: tuple, norm, eps: float, gate_up: tuple, down: tuple):
    """The residual stream (in x's dtype) after the attention output [N, heads * head_dim] and the
    MLP; normed stream, MLP activations."""
    y = x + _linear(attended, o)
    h = _rms_norm(y, norm, eps)
    gate, up = _linear(h, gate_up).chunk(2, dim=-1)
    act = F.silu(gate) * up
    return (y + _linear(act, down)).to(x.dtype), h, act


def _between(x, attended, cos, sin, after: tuple, before: tuple):
    """Layer i after its attention, then layer i + 1 up to its attention: one call, larger kernels.
    after/before: `_after_attention`'s and `_before_attention`'s weights. -> the stream, q, k, v of
    layer i + 1, then the stored intermediates."""
    x, h, act = _after_attention(x, attended, *after)
    q, k, v, h2 = _before_attention(x, cos, sin, *before)
    return x, q, k, v, h, act, h2


def _head(x, norm, eps: float, projection: tuple):
    """Final norm and output layer: x [N, hidden] -> float32 logits [N, vocab]; normed x."""
    h = _rms_norm(x, norm, eps)
    return _linear(h, projection).float(), h


class InductorLayers:
    """The compiled per-token parts of `layers` (a model's decoder layers) and of its output head."""

    max_tokens = MAX_TOKENS

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], dtype: torch.dtype,
                 family: Family) -> None:
        """dtype: the activations'; family: the model's description (head counts and size, the norms'
        epsilon). Joins each layer's q/k/v and gate/up weights (and biases) into one buffer each
        (`joined_projection`) and compiles every token count (`_warm_up`)."""
        heads, kv_heads, head_dim = self._shape = family.shape
        self.dtype, eps = dtype, family.norm_eps
        self._layers = []
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            self._layers.append((
                (layer.input_layernorm.weight, eps, joined_projection([a.q_proj, a.k_proj, a.v_proj]),
                 (a.q_norm.weight, a.k_norm.weight) if family.qk_norm else None, head_dim, heads, kv_heads),
                (projection(a.o_proj), layer.post_attention_layernorm.weight, eps,
                 joined_projection([mlp.gate_proj, mlp.up_proj]), projection(mlp.down_proj))))
        self._head = (model.model.norm.weight, eps, projection(model.lm_head))
        self._slides = [family.slides(layer.self_attn.layer_idx) for layer in layers]
        # One graph per token count (1 .. MAX_TOKENS), all compiled by `_warm_up`.
        self._eager = [_before_attention, _after_attention, _head, _between]
        self._compiled = [torch.compile(f, dynamic=False) for f in self._eager]
        self.failed: str | None = None
        self._warm_up(model.config.hidden_size, dtype, head_dim, heads)

    def _warm_up(self, hidden: int, dtype: torch.dtype, head_dim: int, heads: int) -> None:
        """Compile every token count now: a compile inside a live step would take seconds, and the
        cost-aware policy would read it as that draft length's cost."""
        # Dynamo keeps at most 8 graphs per function by default (a limit on compiling more, not on
        # using them): raised while this model's graphs are made, so another model's fit too.
        with torch.inference_mode(), torch._dynamo.config.patch(recompile_limit=256):
            for n in range(1, MAX_TOKENS + 1):
                x = torch.zeros(n, hidden, dtype=dtype)
                cos, sin = (torch.zeros(n, head_dim, dtype=dtype) for _ in range(2))  # distinct, as a step's
                self.before_attention(0, x, cos, sin)
                attended = torch.zeros(n, heads * head_dim, dtype=dtype)
                self.after_attention(0, x, attended)
                self.head(x)
                if len(self._layers) > 1:
                    self.between(0, x, attended, cos, sin)

    @staticmethod
    def applies(model: torch.nn.Module, layers: list[torch.nn.Module], dtype: torch.dtype) -> bool:
        """Whether the layers are plain (SiLU MLP, RMS norms, linears all float or all int8) on CPU
        with float activations."""
        if model_device(model).type != "cpu" or not dtype.is_floating_point:
            return False
        family = family_of(model.config)
        if family is None or family.sandwich_norms or family.norm_offset or family.local_rope:  # Gemma's: not in the parts
            return False
        linears = layer_linears(model, layers)
        return (all(silu_mlp(layer.mlp) for layer in layers) and all(plain_linear(m) for m in linears)
                and len({type(m) is WeightOnlyInt8Linear for m in linears}) == 1)

    def takes(self, tokens: int, width: int) -> bool:
        """Whether a pass of this many tokens (`width` a row) runs here (larger ones, and every pass
        once compiling has failed, run the eager layers)."""
        return self.failed is None and tokens <= MAX_TOKENS

    def stack(self, p: Pass) -> torch.Tensor:
        """Every layer: the compiled parts, with torch's attention between them."""
        heads, kv_heads, head_dim = self._shape
        cos, sin = p.flat(p.cos), p.flat(p.sin)  # [N, head_dim]: the rotary embedding is inside the parts
        x, qkv = p.x, self.before_attention(0, p.x, cos, sin)  # then one call between attentions
        for i in range(len(self._layers)):
            q, k, v = (p.heads(y, n, head_dim, self.dtype) for y, n in zip(qkv, (heads, kv_heads, kv_heads)))
            out = attend_by_sdpa(p, i, q, k, v, self.dtype, kv_heads != heads, self._slides[i])
            if i + 1 < len(self._layers):
                x, *qkv = self.between(i, x, out, cos, sin)
            else:
                x = self.after_attention(i, x, out)
        return x

    def _call(self, which: int, keep: int, rows: tuple[torch.Tensor, ...], *weights):
        """Run part `which` on `rows` (tensors of N rows each); return its first `keep` outputs."""
        out = None
        if self.failed is None:
            try:
                out = self._compiled[which](*rows, *weights)
            except Exception as error:  # a compiler that cannot run here: eager gives the same output once
                self.failed = f"{type(error).__name__}: {error}".splitlines()[0]
                warnings.warn(f"compiling the CPU decode step failed ({self.failed}); running it eagerly",
                              RuntimeWarning, stacklevel=3)
        if out is None:
            out = self._eager[which](*rows, *weights)
        return out[:keep]

    def before_attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Layer i: x [N, hidden], cos/sin [N, head_dim] -> q, k, v [N, heads * head_dim] (q, k rotated)."""
        return self._call(0, 3, (x, cos, sin), *self._layers[i][0])

    def after_attention(self, i: int, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Layer i: the residual stream x [N, hidden] after attention's output [N, heads * head_dim] and the MLP."""
        return self._call(1, 1, (x, attended), *self._layers[i][1])[0]

    def between(self, i: int, x: torch.Tensor, attended: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """`after_attention(i, ...)` then `before_attention(i + 1, ...)` in one call: the stream and
        layer i + 1's q, k, v."""
        return self._call(3, 4, (x, attended, cos, sin), self._layers[i][1], self._layers[i + 1][0])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab]."""
        return self._call(2, 1, (x,), *self._head)[0]
