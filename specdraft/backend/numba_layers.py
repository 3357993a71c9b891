"""`NumbaLayers`: a Llama layer's per-token work on CPU as numba kernels, for float32 weights.

A CPU decode step is bound by reading the weights, so what matters is how fast a projection of a
few tokens streams its weight rows. Inductor's reduction (`fused.FusedLayers`) sums each row in
one vector accumulator, a chain of dependent adds, and puts a barrier between its many loops: all
of a layer's weights read at ~20 GB/s. Here each projection is one parallel loop over blocks of
weight rows (`_project`): a row is loaded once and dotted with up to four tokens at a time, the sum
spread over vector lanes (numba's `reassoc`), ~28 GB/s on the same machine
(`benchmarks/results/cpu_profile.md`). A layer is five parallel loops: q/k/v; attention (the new
keys and values written first); the output projection with its residual; gate and up; down with
its residual. Norms, the rotary embedding and SiLU run between them on the calling thread, and the
whole layer stack is one call from Python.

Same arithmetic as the eager layer, summed in another order: logits agree to float rounding
(`tests/test_numba_layers.py`), greedy output equals Hugging Face `generate`'s on every test and
benchmark prompt. Only float32 weights and activations (the target on CPU); int8 draft copies and
other dtypes keep inductor's parts. Kernels are compiled once per machine (numba's disk cache) and
loaded when the layers are built, so no step pays for compiling.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange
from numba.typed import List

from specdraft.backend.cache import RowKVCache
from specdraft.backend.fused import joined_projection, layer_linears, norm_eps, projection, silu_mlp
from specdraft.backend.linear import FewRowsLinear

MAX_TOKENS = 32  # passes of up to this many tokens run here; larger ones run the eager layers (BLAS wins there)
_BLOCK = 16  # weight rows per parallel work item
_SUM = {"reassoc", "contract"}  # sums spread over vector lanes, multiply-adds fused; no other liberty


@njit(parallel=True, fastmath=_SUM, cache=True)
def _project(w, b, x, y, residual):  # pragma: no cover - compiled
    """y[t, r] = w[r] . x[t] + b[r] (+ residual[t, r] if residual has rows). w [out, in], x [N, in]."""
    out, n, width = w.shape[0], x.shape[0], w.shape[1]
    add = residual.shape[0] > 0
    for block in prange((out + _BLOCK - 1) // _BLOCK):
        for r in range(block * _BLOCK, min(out, block * _BLOCK + _BLOCK)):
            t = 0
            while t < n:
                # Four tokens per pass over the row (the row is read once; fewer loads per multiply-add).
                a0 = a1 = a2 = a3 = np.float32(0.0)
                if t + 4 <= n:
                    for i in range(width):
                        wi = w[r, i]
                        a0 += wi * x[t, i]
                        a1 += wi * x[t + 1, i]
                        a2 += wi * x[t + 2, i]
                        a3 += wi * x[t + 3, i]
                    sums = (a0, a1, a2, a3)
                    step = 4
                else:
                    for i in range(width):
                        a0 += w[r, i] * x[t, i]
                    sums = (a0, a1, a2, a3)
                    step = 1
                for j in range(step):
                    y[t + j, r] = sums[j] + b[r] + (residual[t + j, r] if add else np.float32(0.0))
                t += step


_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)


@njit(fastmath=_SUM, cache=True)
def _exp(x, out, scale):  # pragma: no cover - compiled
    """out = exp(x) for float32 rows x [n], as two loops that vectorise (a libm call per element does
    not, and at a few tokens the attention's and SiLU's exponentials cost a third of a step):
    exp(x) = 2^m * p(r), m = round(x / ln 2), r = x - m ln 2 in [-ln2/2, ln2/2], p its Taylor
    polynomial to r^7 (relative error ~1e-7, float32 rounding). x is clamped to [-87, 88], where
    float32's exponential stays normal. scale: int32 scratch [n]."""
    for i in range(x.shape[0]):
        v = min(max(x[i], np.float32(-87.0)), np.float32(88.0))
        m = np.floor(v * _LOG2E + np.float32(0.5))
        r = v - m * _LN2_HI - m * _LN2_LO
        out[i] = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(0.5) + r * (
            np.float32(1.0 / 6) + r * (np.float32(1.0 / 24) + r * (np.float32(1.0 / 120) + r * (
                np.float32(1.0 / 720) + r * np.float32(1.0 / 5040)))))))
        scale[i] = (np.int32(m) + np.int32(127)) << np.int32(23)  # 2^m as float32 bits
    factor = scale.view(np.float32)
    for i in range(x.shape[0]):
        out[i] *= factor[i]


@njit(cache=True)
def _silu_gate(gate_up, act):  # pragma: no cover - compiled
    """act[t, j] = silu(gate[t, j]) * up[t, j]; gate_up [N, 2 * inter]: gate, then up."""
    inter = act.shape[1]
    negated, e, scale = np.empty(inter, np.float32), np.empty(inter, np.float32), np.empty(inter, np.int32)
    for t in range(act.shape[0]):
        for j in range(inter):
            negated[j] = -gate_up[t, j]
        _exp(negated, e, scale)
        for j in range(inter):
            act[t, j] = gate_up[t, j] / (np.float32(1.0) + e[j]) * gate_up[t, inter + j]


@njit(fastmath=_SUM, cache=True)
def _rms_norm(x, weight, eps, out):  # pragma: no cover - compiled
    """Transformers' `LlamaRMSNorm` in float32: out = weight * x / sqrt(mean(x^2) + eps), per row."""
    width = x.shape[1]
    for t in range(x.shape[0]):
        s = np.float32(0.0)
        for i in range(width):
            s += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.sqrt(s / np.float32(width) + np.float32(eps))
        for i in range(width):
            out[t, i] = weight[i] * (x[t, i] * scale)


@njit(cache=True)
def _rotate(y, start, heads, head_dim, cos, sin):  # pragma: no cover - compiled
    """Rotary embedding in place on y[:, start : start + heads * head_dim] (transformers' `rotate_half`)."""
    half = head_dim // 2
    for t in range(y.shape[0]):
        for head in range(heads):
            o = start + head * head_dim
            for d in range(half):
                a, c = y[t, o + d], y[t, o + d + half]
                y[t, o + d] = a * cos[t, d] - c * sin[t, d]
                y[t, o + d + half] = c * cos[t, d + half] + a * sin[t, d + half]


_NONE = np.zeros((0, 0), np.float32)


@njit(cache=True)
def _before_attention(x, cos, sin, norm, eps, w, b, heads, kv_heads, head_dim):  # pragma: no cover - compiled
    """x [N, hidden] -> the joined q/k/v rows [N, (heads + 2 kv_heads) * head_dim], q and k rotated."""
    h = np.empty_like(x)
    _rms_norm(x, norm, eps, h)
    qkv = np.empty((x.shape[0], w.shape[0]), np.float32)
    _project(w, b, h, qkv, _NONE)
    _rotate(qkv, 0, heads, head_dim, cos, sin)
    _rotate(qkv, heads * head_dim, kv_heads, head_dim, cos, sin)
    return qkv


@njit(cache=True)
def _after_attention(x, attended, wo, bo, norm, eps, w_gate_up, b_gate_up, w_down, b_down):  # pragma: no cover
    """The residual stream x [N, hidden] after the attention output [N, heads * head_dim] and the MLP."""
    y = np.empty_like(x)
    _project(wo, bo, attended, y, x)
    h = np.empty_like(x)
    _rms_norm(y, norm, eps, h)
    gate_up = np.empty((x.shape[0], w_gate_up.shape[0]), np.float32)
    _project(w_gate_up, b_gate_up, h, gate_up, _NONE)
    act = np.empty((x.shape[0], w_gate_up.shape[0] // 2), np.float32)
    _silu_gate(gate_up, act)
    out = np.empty_like(x)
    _project(w_down, b_down, act, out, y)
    return out


@njit(cache=True)
def _head(x, norm, eps, w, b):  # pragma: no cover - compiled
    """Final norm and output layer: x [N, hidden] -> logits [N, vocab]."""
    h = np.empty_like(x)
    _rms_norm(x, norm, eps, h)
    logits = np.empty((x.shape[0], w.shape[0]), np.float32)
    _project(w, b, h, logits, _NONE)
    return logits


@njit(parallel=True, fastmath=_SUM, cache=True)
def _attend(qkv, rows, positions, visible, keys, values, heads, kv_heads, head_dim, out):  # pragma: no cover
    """Write each token's k and v into its row's cache at its position, then attention: out [N, heads *
    head_dim]. qkv [N, (heads + 2 kv_heads) * head_dim] (q, k rotated); rows, positions [N]: each
    token's row in the window and position; visible [N, kv] bool; keys, values [batch, kv_heads,
    capacity, head_dim]: this layer's, the window's rows."""
    n, kv = qkv.shape[0], visible.shape[1]
    group = heads // kv_heads
    scale = np.float32(1.0 / np.sqrt(head_dim))
    for t in range(n):  # all writes first: a row's tokens in this pass see each other
        for g in range(kv_heads):
            for d in range(head_dim):
                keys[rows[t], g, positions[t], d] = qkv[t, (heads + g) * head_dim + d]
                values[rows[t], g, positions[t], d] = qkv[t, (heads + kv_heads + g) * head_dim + d]
    for job in prange(n * kv_heads):  # a token's query heads that share a kv head share its key and value loads
        t, g = job // kv_heads, job % kv_heads
        seen = visible[t]
        k, v = keys[rows[t], g], values[rows[t], g]  # [capacity, head_dim]
        scores = np.full((group, kv), -np.inf, np.float32)
        tops = np.full(group, -np.inf, np.float32)
        for j in range(kv):
            if seen[j]:
                kj = k[j]
                for u in range(group):
                    # Slices, so that the inner loops index from 0 and vectorise.
                    query = qkv[t, (g * group + u) * head_dim : (g * group + u + 1) * head_dim]
                    acc = np.float32(0.0)
                    for d in range(head_dim):
                        acc += query[d] * kj[d]
                    scores[u, j] = acc * scale
                    tops[u] = max(tops[u], scores[u, j])
        weights, scratch = np.empty((group, kv), np.float32), np.empty(kv, np.int32)
        for u in range(group):
            for j in range(kv):
                scores[u, j] -= tops[u]  # unseen entries (-inf) get weights that are never read
            _exp(scores[u], weights[u], scratch)
        totals = np.zeros(group, np.float32)
        attended = np.zeros((group, head_dim), np.float32)
        for j in range(kv):
            if seen[j]:
                vj = v[j]
                for u in range(group):
                    e = weights[u, j]
                    totals[u] += e
                    row = attended[u]
                    for d in range(head_dim):
                        row[d] += e * vj[d]
        for u in range(group):
            o = out[t, (g * group + u) * head_dim : (g * group + u + 1) * head_dim]
            for d in range(head_dim):
                o[d] = attended[u, d] / totals[u]


@njit(cache=True)
def _stack(x, cos, sin, rows, positions, visible, keys, values, before, after, eps, heads, kv_heads,
           head_dim):  # pragma: no cover - compiled
    """Every layer on x [N, hidden]: q/k/v, cache writes, attention, output projection and MLP.
    before[i]: (norm, q/k/v weight, bias); after[i]: `_after_attention`'s weights but the norm's eps;
    eps [layers, 2]. Returns the stream after the last layer."""
    attended = np.empty((x.shape[0], heads * head_dim), np.float32)
    for i in range(len(before)):
        norm, w, b = before[i]
        qkv = _before_attention(x, cos, sin, norm, eps[i, 0], w, b, heads, kv_heads, head_dim)
        _attend(qkv, rows, positions, visible, keys[i], values[i], heads, kv_heads, head_dim, attended)
        wo, bo, norm2, w_gate_up, b_gate_up, w_down, b_down = after[i]
        x = _after_attention(x, attended, wo, bo, norm2, eps[i, 1], w_gate_up, b_gate_up, w_down, b_down)
    return x


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _weights(linear: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias or None, _), as `fused.projection` gives it -> numpy views (zeros for no bias)."""
    weight, bias, _ = linear
    return _array(weight), _array(bias) if bias is not None else np.zeros(weight.shape[0], np.float32)


class NumbaLayers:
    """The per-token parts of `layers` (a model's decoder layers), attention over a `RowKVCache`
    and the output head, as numba kernels over the model's own weights (q/k/v and gate/up joined
    into one buffer each, no copy)."""

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], head_dim: int, heads: int,
                 kv_heads: int) -> None:
        self._shape = (heads, kv_heads, head_dim)
        before, after, eps = List(), List(), []
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            before.append((_array(layer.input_layernorm.weight), *_weights(joined_projection([a.q_proj, a.k_proj, a.v_proj]))))
            after.append((*_weights(projection(a.o_proj)), _array(layer.post_attention_layernorm.weight),
                          *_weights(joined_projection([mlp.gate_proj, mlp.up_proj])), *_weights(projection(mlp.down_proj))))
            eps.append((norm_eps(layer.input_layernorm), norm_eps(layer.post_attention_layernorm)))
        self._before, self._after, self._eps = before, after, np.array(eps, dtype=np.float64)  # eps [layers, 2]
        self._head = (_array(model.model.norm.weight), norm_eps(model.model.norm), *_weights(projection(model.lm_head)))
        self.failed: str | None = None  # as `FusedLayers`'s: numba's kernels, once compiled, do not fail later
        self._buffers: tuple = (None, None, None)  # (cache, its generation and window, (keys, values) typed lists)
        self._warm_up(model.config.hidden_size, len(layers))

    def _warm_up(self, hidden: int, layers: int) -> None:
        """Compile the kernels now, or load them from numba's disk cache: no step pays for it."""
        heads, kv_heads, head_dim = self._shape
        cache = RowKVCache(layers, kv_heads, head_dim, torch.float32, torch.device("cpu"), slots=1, capacity=2)
        cache.push_row()
        cache.prepare(slice(0, 1), torch.zeros(1, 1, dtype=torch.int64), 1)
        x = torch.zeros(1, hidden)
        rotary = torch.zeros(1, head_dim)
        self.head(self.stack(x, rotary, rotary, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                             torch.ones(1, 1, dtype=torch.bool), cache))
        self._buffers = (None, None, None)  # hold no reference to the warm-up cache

    @staticmethod
    def applies(model: torch.nn.Module, layers: list[torch.nn.Module], dtype: torch.dtype) -> bool:
        """Whether the layers are plain (SiLU MLP, RMS norms, float32 linears) on CPU, with float32 activations."""
        if model.model.embed_tokens.weight.device.type != "cpu" or dtype != torch.float32:
            return False
        return (all(silu_mlp(layer.mlp) for layer in layers)
                and all(type(m) in (torch.nn.Linear, FewRowsLinear) and m.weight.dtype == torch.float32
                        for m in layer_linears(model, layers)))

    @staticmethod
    def takes(tokens: int) -> bool:
        """Whether a pass of this many tokens runs here (larger ones run the eager layers)."""
        return tokens <= MAX_TOKENS

    @staticmethod
    def use_torch_threads() -> None:
        """Numba's threads follow torch's (`specdraft.threads`); set per calling thread, as numba keeps it."""
        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)

    def _cache(self, cache: RowKVCache) -> tuple:
        """The prepared pass's keys and values per layer as typed lists (rebuilt when the window or
        the cache's buffers change)."""
        held, key, buffers = self._buffers
        now = (cache.generation, cache.window.start, cache.window.stop)
        if held is not cache or key != now:
            keys, values = cache.window_buffers()
            buffers = (List([k.numpy() for k in keys]), List([v.numpy() for v in values]))
            self._buffers = (cache, now, buffers)
        return buffers

    def stack(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
              visible: torch.Tensor, cache: RowKVCache) -> torch.Tensor:
        """Every layer on the tokens x [N, hidden]: cos, sin [N, head_dim]; rows, positions [N] (each
        token's row in the cache's prepared window, its position); visible [N, kv] bool (which cache
        entries each token sees). Writes the tokens' keys and values; returns the stream [N, hidden]."""
        assert cache.dtype == torch.float32 and cache.num_layers == len(self._before)
        self.use_torch_threads()
        keys, values = self._cache(cache)
        with torch.profiler.record_function("specdraft::numba_stack"):  # a profile's name for this call
            x = _stack(_array(x), _array(cos), _array(sin), _array(rows), _array(positions), _array(visible),
                       keys, values, self._before, self._after, self._eps, *self._shape)
        return torch.from_numpy(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab]."""
        self.use_torch_threads()
        with torch.profiler.record_function("specdraft::numba_head"):
            return torch.from_numpy(_head(_array(x), *self._head))
