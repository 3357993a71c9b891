"""`NumbaLayers`: the layer class, and the kernels it runs a pass's layers with (`_stack`, every layer
in one call; `_head`, the output head), composed of this package's parts: projections, element math,
attention. What they know of the model is its `Family`'s numbers (head counts and size, the norms'
epsilon); biases come in with the weights (`step_weights`), zeros where a projection has none."""

from __future__ import annotations

import contextlib
import os

import numba
import numpy as np
import torch
from numba import njit
from numba.typed import List

from specdraft.backend import native
from specdraft.backend.paged import PagedKVCache
from specdraft.backend.family import Family
from specdraft.backend.layers import Pass
from specdraft.backend.numba_layers.attention import attend, attention_kernel
from specdraft.backend.numba_layers.elementwise import gelu_tanh_gate, head_norm, rms_norm, rotate, silu_gate
from specdraft.backend.numba_layers.grouping import host_array, native_kernel, step_weights
from specdraft.backend.numba_layers.huge_pages import on_huge_pages
from specdraft.backend.numba_layers.projection import NO_KERNEL, NO_RESIDUAL, project
from specdraft.backend.weights import linears_arithmetic, linears_reader, mlp_gate, model_device, projections

MAX_TOKENS = 32  # tokens a call of the layer stack computes
# With SPECDRAFT_INVARIANT_PREFILL=1, passes longer than MAX_TOKENS (prefill chunks) run here too, in
# calls of MAX_TOKENS tokens, so that a prompt's keys and values are those token-by-token decoding
# writes (a prefix-cache hit's logits equal a cold run's bitwise), slower than BLAS's prefill beyond a
# few hundred tokens (`benchmarks/results/cpu/cpu_prefill.md`); by default they run the eager layers
# (BLAS: the same tokens, logits equal to float rounding).
LONG_PASSES = os.environ.get("SPECDRAFT_INVARIANT_PREFILL") == "1"
# Any pass of up to this many tokens runs here too, a short prompt's prefill included: the stack is the
# faster there (`cpu_prefill.md`: 1.15x BLAS at 128 tokens), and the eager layers' linears compute
# each of up to 64 rows on its own (`backend/linear.py`), which a prefill need not pay.
SHORT_PASS = 128
GATES = ("silu", "swish", "gelu_pytorch_tanh")  # the MLP gates the stack computes (`_after_attention`)


@njit(cache=True)
def _before_attention(x, cos, sin, norm, eps, qkv_weights, head_norms, heads, kv_heads, head_dim,
                      kernel):  # pragma: no cover - compiled
    """x [N, hidden] -> the joined q/k/v rows [N, (heads + 2 kv_heads) * head_dim], q and k normed per
    head where `head_norms` (q's weight, k's: [head_dim] each, or empty) holds weights, then rotated.
    qkv_weights: two parts (`grouping._parts`), whose outputs lie side by side."""
    h = np.empty_like(x)
    rms_norm(x, norm, eps, h)
    first, second = qkv_weights
    split = first[2].shape[0]
    qkv = np.empty((x.shape[0], split + second[2].shape[0]), np.float32)
    project(first, h, qkv[:, :split], NO_RESIDUAL, kernel)
    if second[2].shape[0]:
        project(second, h, qkv[:, split:], NO_RESIDUAL, kernel)
    q_norm, k_norm = head_norms
    if q_norm.shape[0]:
        head_norm(qkv, 0, heads, head_dim, q_norm, eps)
        head_norm(qkv, heads * head_dim, kv_heads, head_dim, k_norm, eps)
    rotate(qkv, 0, heads, head_dim, cos, sin)
    rotate(qkv, heads * head_dim, kv_heads, head_dim, cos, sin)
    return qkv


@njit(cache=True)
def _joined(x, weights, inputs, post_norm, eps, kernel):  # pragma: no cover - compiled
    """x plus a projection of `inputs`, normed first where `post_norm` holds a weight (else empty)."""
    out = np.empty_like(x)
    if not post_norm.shape[0]:
        project(weights, inputs, out, x, kernel)  # the residual added by the projection
        return out
    y, normed = np.empty_like(x), np.empty_like(x)
    project(weights, inputs, y, NO_RESIDUAL, kernel)
    rms_norm(y, post_norm, eps, normed)
    for t in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[t, i] = x[t, i] + normed[t, i]
    return out


@njit(cache=True)
def _after_attention(x, attended, out_weights, norm, eps, gate_up_weights, down_weights, post_norms, gelu,
                     kernel):  # pragma: no cover - compiled
    """The residual stream x [N, hidden] after the attention output [N, heads * head_dim] and the MLP
    (`norm`, its input's), each normed before it joins where `post_norms` (the attention's, the
    MLP's) holds weights; the MLP's gate GELU-tanh where `gelu`, else SiLU."""
    y = _joined(x, out_weights, attended, post_norms[0], eps, kernel)
    h = np.empty_like(x)
    rms_norm(y, norm, eps, h)
    gate_up = np.empty((x.shape[0], gate_up_weights[0].shape[0]), np.float32)
    project(gate_up_weights, h, gate_up, NO_RESIDUAL, kernel)
    act = np.empty((x.shape[0], gate_up.shape[1] // 2), np.float32)
    if gelu:
        gelu_tanh_gate(gate_up, act)
    else:
        silu_gate(gate_up, act)
    return _joined(y, down_weights, act, post_norms[1], eps, kernel)


@njit(cache=True)
def _head(x, norm, eps, weights, kernel):  # pragma: no cover - compiled
    """Final norm and output layer: x [N, hidden] -> logits [N, vocab]."""
    h = np.empty_like(x)
    rms_norm(x, norm, eps, h)
    logits = np.empty((x.shape[0], weights[0].shape[0]), np.float32)
    project(weights, h, logits, NO_RESIDUAL, kernel)
    return logits


@njit(cache=True)
def _head_rows(x, norm, eps, weights, kept, blocks, kernel):  # pragma: no cover - compiled
    """`_head` of the output layer's first `kept` rows and of its rows in `blocks` (indices of
    BLOCK_ROWS-row blocks at or past `kept`): logits [N, vocab], -inf at every other row."""
    h = np.empty_like(x)
    rms_norm(x, norm, eps, h)
    w, scales, bias, kind = weights
    logits = np.full((x.shape[0], w.shape[0]), -np.inf, np.float32)
    first = (w[:kept], scales[:kept] if scales.shape[0] else scales, bias[:kept], kind)
    project(first, h, logits[:, :kept], NO_RESIDUAL, kernel)
    if kernel[0] != 0:
        native.project_blocks(weights, h, logits, blocks, kernel)
    else:
        for block in blocks:
            a, b = block * BLOCK_ROWS, min(w.shape[0], block * BLOCK_ROWS + BLOCK_ROWS)
            rows = (w[a:b], scales[a:b] if scales.shape[0] else scales, bias[a:b], kind)
            project(rows, h, logits[:, a:b], NO_RESIDUAL, kernel)
    return logits


BLOCK_ROWS = 16  # rows a block of `_head_rows` holds (the int8 arithmetic's whole tiles; `project_blocks`'s)


@njit(cache=True)
def _stack(x, rotary, rows, positions, visible, windowed, slides, keys, values, table, before, after, eps, gelu,
           heads, kv_heads, head_dim, kernel, attention, threads):  # pragma: no cover - compiled
    """Every layer on x [N, hidden]: q/k/v, cache writes, attention, output projection and MLP.
    before[i]: (norm, q/k/v weights, q/k head norms); after[i]: `_after_attention`'s weights but the
    norm's eps and `gelu`; eps: every norm's; kernel: `project`'s; attention, threads: `attend`'s kernel
    and threads; visible [N, kv]: the entries each token sees, `windowed` those of its sliding window;
    rotary: (cos, sin, the sliding layers' cos, sin) [N, head_dim] each; layer i attends over its
    window, rotated by the sliding layers' cos and sin, where slides[i]. Returns the stream after the
    last layer."""
    attended = np.empty((x.shape[0], heads * head_dim), np.float32)
    cos, sin, local_cos, local_sin = rotary
    for i in range(len(before)):
        norm, qkv_weights, head_norms = before[i]
        c, s = (local_cos, local_sin) if slides[i] else (cos, sin)
        qkv = _before_attention(x, c, s, norm, eps, qkv_weights, head_norms, heads, kv_heads, head_dim, kernel)
        attend(qkv, rows, positions, windowed if slides[i] else visible, keys[i], values[i], table, heads, kv_heads,
               head_dim, attended, attention, threads)
        out_weights, norm2, gate_up_weights, down_weights, post_norms = after[i]
        x = _after_attention(x, attended, out_weights, norm2, eps, gate_up_weights, down_weights, post_norms, gelu,
                             kernel)
    return x


_NONE = np.empty(0, np.float32)  # a norm a family does not have


def _norm(module: torch.nn.Module, family: Family) -> np.ndarray:
    """What an RMS norm scales by: its weight, or (offset + weight) in float32 as transformers' Gemma
    norm computes it, where the family's norms are offset."""
    weight = module.weight.detach().float()
    return host_array(weight + family.norm_offset if family.norm_offset else weight)


def _head_norms(layer: torch.nn.Module, family: Family) -> tuple[np.ndarray, np.ndarray]:
    """A layer's q and k head norms ([head_dim] each; empty where the family has none)."""
    if not family.qk_norm:
        return _NONE, _NONE
    return _norm(layer.self_attn.q_norm, family), _norm(layer.self_attn.k_norm, family)


def _mlp_norms(layer: torch.nn.Module, family: Family) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A layer's MLP input norm, and its norms of the attention's and the MLP's outputs (empty where the
    family has no sandwich norms)."""
    if not family.sandwich_norms:
        return _norm(layer.post_attention_layernorm, family), (_NONE, _NONE)
    outputs = (_norm(layer.post_attention_layernorm, family), _norm(layer.post_feedforward_layernorm, family))
    return _norm(layer.pre_feedforward_layernorm, family), outputs


@njit(cache=True)
def _as_list(items):  # pragma: no cover - compiled
    """A homogeneous tuple as a typed list, made in compiled code: numba's disk cache keeps this for
    every item type, while a list built from Python compiles its methods again in each process (a
    second at start)."""
    out = List()
    for item in items:
        out.append(item)
    return out


def _named(name: str):
    """The call's name in a torch profile, where a profiler runs; nothing otherwise (entering a
    `record_function` costs a step time even where no profiler runs)."""
    return torch.profiler.record_function(name) if torch._C._autograd._profiler_enabled() else contextlib.nullcontext()


class NumbaLayers:
    """The per-token parts of `layers` (a model's decoder layers), attention over a `PagedKVCache`
    and the output head, as numba kernels over the model's own weights: moved once, when these
    layers are built, onto 2 MB pages in the order a step reads them, q/k/v and gate/up adjacent (one
    buffer each); the model's modules keep using them (views, nothing kept twice). `family`: the
    model's description (its head counts and size, its norms' epsilon)."""

    max_tokens = MAX_TOKENS

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], family: Family) -> None:
        heads, kv_heads, head_dim = self._shape = family.shape
        on_huge_pages(model, [g for layer in layers for g in projections(layer)] + [[model.lm_head]])
        compiled = native_kernel(model, layers)
        self.arithmetic = linears_arithmetic(model, layers)
        self._kernel = NO_KERNEL if compiled is None else compiled.calls(self.arithmetic)
        self.attention_address = attention_kernel(heads, kv_heads, head_dim)  # `attend`'s kernel (0: numba's loops)
        weights = step_weights(model, layers, native=compiled is not None)
        before, after = [], []
        for i, layer in enumerate(layers):
            qkv, out, gate_up, down = weights[4 * i : 4 * i + 4]
            before.append((_norm(layer.input_layernorm, family), qkv, _head_norms(layer, family)))
            mlp_norm, post_norms = _mlp_norms(layer, family)
            after.append((out, mlp_norm, gate_up, down, post_norms))
        self._before, self._after, self._eps = _as_list(tuple(before)), _as_list(tuple(after)), family.norm_eps
        self._slides = np.array([family.slides(layer.self_attn.layer_idx) for layer in layers], np.bool_)
        self._gelu = family.activation == "gelu_tanh"
        self._head = (_norm(model.model.norm, family), family.norm_eps, weights[-1], self._kernel)
        self._vocabulary = weights[-1][0].shape[0]  # the output layer's rows: the logits `head` computes
        self._kept: tuple[int, np.ndarray] | None = None  # `keep_vocabulary`'s rows, and its other blocks (`also_rows`)
        self._warm_up(model.config.hidden_size, len(layers))

    def _warm_up(self, hidden: int, layers: int) -> None:
        """Compile the kernels now, or load them from numba's disk cache: no step pays for it."""
        heads, kv_heads, head_dim = self._shape
        cache = PagedKVCache(layers, kv_heads, head_dim, torch.float32, torch.device("cpu"))
        cache.push_row()
        cache.prepare(slice(0, 1), torch.zeros(1, 1, dtype=torch.int64), 1)
        x = torch.zeros(1, hidden)
        rotary = (torch.zeros(1, head_dim),) * 4
        self.head(self._run(x, rotary, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                            torch.ones(1, 1, dtype=torch.bool), cache))

    def use_kernel_build(self, path: str) -> None:
        """Run on another build of the compiled kernel (`native.PATHS`), for a benchmark to compare:
        every build gives bitwise the same sums. Only where the kernel reads the weights."""
        assert self._kernel != NO_KERNEL, "numba's loops read these weights"
        built = native.kernel(path)
        self._kernel = built.calls(self.arithmetic)
        self._head = (*self._head[:3], self._kernel)
        if self.attention_address:
            self.attention_address = built.attend_address

    @staticmethod
    def applies(model: torch.nn.Module, layers: list[torch.nn.Module], dtype: torch.dtype) -> bool:
        """Whether the layers are plain (a SiLU or GELU-tanh gated MLP, RMS norms) on CPU, with float32 activations, and
        their linears read by the compiled kernel or numba's loops (`native.reader`: all float32 or
        GGUF blocks where the kernel compiles, else all float32 or all int8 `WeightOnlyInt8Linear`s)."""
        if model_device(model).type != "cpu" or dtype != torch.float32:
            return False
        read = linears_reader(model, layers) in (native.Reader.KERNEL, native.Reader.NUMBA)
        return all(mlp_gate(layer.mlp) in GATES for layer in layers) and read

    def takes(self, tokens: int, width: int) -> bool:
        """Whether a pass of `tokens` tokens, `width` a row, runs here (a pass of more than `MAX_TOKENS`
        tokens in calls of that many, each token computed as a decode step computes it): every pass
        where `LONG_PASSES` or the int8 arithmetic; else every pass that feeds a row at most
        `MAX_TOKENS` tokens, decode and verify steps of any batch (their tokens must be computed as a
        plain step computes them, whatever the rows beside them), and every pass of up to
        `SHORT_PASS` tokens; a longer prefill chunk runs the eager layers (BLAS)."""
        return (LONG_PASSES or self.arithmetic == "int8" or width <= MAX_TOKENS  # the eager layers have no int8
                or tokens <= SHORT_PASS)

    def stack(self, p: Pass) -> torch.Tensor:
        """Every layer on the pass's tokens, attention and cache writes included, in one call per
        `MAX_TOKENS` tokens: a longer pass (a prefill chunk) runs as passes of that many in turn, so
        that each of its tokens is computed exactly as a decode or verify step computes it (each
        call writes its tokens' keys and values before attending: later calls see them)."""
        flat = torch.arange(p.batch * p.steps) if p.real is None else p.real  # [N] into [batch * T]
        rotary = [p.flat(t) for t in (*p.rotary_of(False), *p.rotary_of(True))]  # [N, head_dim] each
        rows, positions = flat // p.steps, p.positions.reshape(-1)[flat]
        visible, windowed = ((m[:, 0].reshape(p.batch * p.steps, -1)[flat] if m is not None else None)  # [N, kv]
                             for m in (p.mask, p.window_mask))
        parts = [self._run(p.x[i : i + MAX_TOKENS], tuple(t[i : i + MAX_TOKENS] for t in rotary),
                           rows[i : i + MAX_TOKENS], positions[i : i + MAX_TOKENS], visible[i : i + MAX_TOKENS], p.cache,
                           None if windowed is None else windowed[i : i + MAX_TOKENS])
                 for i in range(0, len(flat), MAX_TOKENS)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    def use_torch_threads() -> None:
        """Numba's threads follow torch's (`specdraft.threads`); set per calling thread, as numba keeps it."""
        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)

    @staticmethod
    def _cache(cache: PagedKVCache) -> tuple:
        """The cache's keys and values pools per layer as typed lists, kept by the cache (rebuilt when
        its pools change)."""
        def typed() -> tuple:
            keys, values = cache.pools()
            return _as_list(tuple(k.numpy() for k in keys)), _as_list(tuple(v.numpy() for v in values))

        return cache.derived(("numba",), typed)

    def _run(self, x: torch.Tensor, rotary: tuple, rows: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
             cache: PagedKVCache, windowed: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer on the tokens x [N, hidden]: rotary, (cos, sin, the sliding layers' cos, sin)
        [N, head_dim] each; rows, positions [N] (each token's row in the cache's prepared window, its
        position); visible [N, kv] bool (which cache entries each token sees; `windowed`, those in its
        sliding window, for the layers that slide). Writes the tokens' keys and values; returns the
        stream [N, hidden]."""
        assert isinstance(cache, PagedKVCache), "the step's attention reads a paged cache (`RowModel` makes one)"
        assert cache.dtype == torch.float32 and cache.num_layers == len(self._before)
        self.use_torch_threads()
        keys, values = self._cache(cache)
        with _named("specdraft::numba_stack"):
            visible = host_array(visible)
            windowed = visible if windowed is None else host_array(windowed)
            x = _stack(host_array(x), tuple(host_array(t) for t in rotary), host_array(rows), host_array(positions),
                       visible, windowed, self._slides, keys, values, cache.table, self._before, self._after,
                       self._eps, self._gelu, *self._shape, self._kernel, self.attention_address,
                       numba.get_num_threads())
        return torch.from_numpy(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab] (-inf at the ids `keep_vocabulary` and
        `also_rows` leave out)."""
        self.use_torch_threads()
        norm, eps, weights, kernel = self._head
        with _named("specdraft::numba_head"):
            if self._kept is None:
                logits = _head(host_array(x), *self._head)
            else:
                logits = _head_rows(host_array(x), norm, eps, weights, *self._kept, kernel)
        return torch.from_numpy(logits)

    def keep_vocabulary(self, tokens: int) -> None:
        """Compute the logits of ids below `tokens` only (a multiple of 16: the int8 arithmetic's whole
        tiles), the output layer's first rows read in place; `head` gives the others -inf. A drafter's
        choice (`drafters.model`): each of those logits is the one the whole layer gives, bitwise."""
        if tokens % BLOCK_ROWS or not 0 < tokens <= self._vocabulary:
            raise ValueError(f"a vocabulary of {tokens} ids: it must be a multiple of 16 up to {self._vocabulary}")
        self._kept = (tokens, np.empty(0, np.int64))
        self.head(torch.zeros(1, self._head[0].shape[0]))  # compile (or load) `_head_rows` now, not in a step

    def also_rows(self, ids: np.ndarray) -> None:
        """Beside the ids `keep_vocabulary` keeps, compute the logits of `ids` too (and of the others
        in their blocks of 16) in the passes that follow, until the next call; each is the one the
        whole layer gives, bitwise."""
        assert self._kept is not None, "keep_vocabulary first"
        kept = self._kept[0]
        ids = np.asarray(ids, np.int64)
        self._kept = (kept, np.unique(ids[(ids >= kept) & (ids < self._vocabulary)] // BLOCK_ROWS))
