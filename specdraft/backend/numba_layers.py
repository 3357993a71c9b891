"""`NumbaLayers`: a Llama layer's per-token work on CPU as numba kernels, for float32, GGUF-block
(native) or int8 weights. One of the ways to run a pass's layers (`specdraft.backend.layers`), the one
the CPU step runs.

Projections: float32 rows and GGUF blocks are read by the compiled kernel (`blocks.cpp`, called by
address from `blocks.project_native`'s parallel loop), which sums both one way, so native and dense weights
give bitwise the same logits (the float32 arithmetic; in the int8 one, the GGUF blocks meet each
token's quantised activations in integer dot products, and every pass runs here, prefill chunks
too: `takes`); int8 draft copies, and float32 weights where no kernel compiles, by numba's own loops
(`_project`, below). Which reads a model's weights: `blocks.reader`.

A CPU decode step is bound by reading the weights, so what matters is how fast a projection of a
few tokens streams its weight rows. Inductor's reduction (`inductor.InductorLayers`) sums each row
in one vector accumulator, a chain of dependent adds, and puts a barrier between its many loops,
well below the memory's rate. Here each projection is one parallel loop over blocks of weight rows
(`project`): two rows at a time, each pair loaded once for up to three tokens, the
sums spread over vector lanes (numba's `reassoc`), the rows further on prefetched when a pass has
several tokens or int8 weights. The weights are moved once onto 2 MB pages in
the order a step reads them (`_on_huge_pages`: no page walk every 4 KB). A layer is five parallel
loops: q/k/v; attention (the new keys and values written first; one token's cache entries split
into spans at fixed offsets among the threads and joined after: each span by the compiled kernel,
`attention.cpp`, where it compiles, else by numba's loops); the output projection with its residual; gate and up; down
with its residual. Norms, the rotary embedding and SiLU run between them on the calling thread,
and the whole layer stack is one call from Python. Between the loops the worker thread spins
briefly (`specdraft.threads`): a sleeping one takes tens of microseconds to wake, and a step has
~150 loops. Where the time goes: `benchmarks/results/cpu_profile.md`.

Same arithmetic as the eager layer, summed in another order: logits agree to float rounding
(`tests/test_numba_layers.py`), greedy output equals Hugging Face `generate`'s on every test and
benchmark prompt. Float32 activations only: float32 weights (the target on CPU), GGUF blocks
(`blocks.BlockLinear`), or int8 ones with per-row scales (`Int8Linear`, the int8 draft copy: each
weight converted as it is read, a quarter of the bytes); other dtypes keep inductor's parts. Kernels are compiled once per machine (numba's
disk cache) and loaded when the layers are built, so no step pays for compiling.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.typed import List

from specdraft.backend import blocks
from specdraft.backend.cache import SPAN, RowKVCache
from specdraft.backend.layers import Pass
from specdraft.backend.weights import (adjacent_view, joined_projection, linears_arithmetic, linears_reader,
                                       model_device, norm_eps, projections, silu_mlp)

MAX_TOKENS = 32  # tokens a call of the layer stack computes
# With SPECDRAFT_INVARIANT_PREFILL=1, passes longer than MAX_TOKENS (prefill chunks) run here too, in
# calls of MAX_TOKENS tokens, so that a prompt's keys and values are those token-by-token decoding
# writes (a prefix-cache hit's logits equal a cold run's bitwise), at 0.6-0.8x BLAS's prefill speed
# beyond a few hundred tokens (`benchmarks/results/cpu_prefill.md`); by default they run the eager
# layers (BLAS: the same tokens, logits equal to float rounding).
LONG_PASSES = os.environ.get("SPECDRAFT_INVARIANT_PREFILL") == "1"
_BLOCK = 16  # weight rows per parallel work item
_SUM = {"reassoc", "contract"}  # sums spread over vector lanes, multiply-adds fused; no other liberty
_AHEAD = 4  # weight rows a thread asks the memory for before it reads them (where `project` prefetches)
_LINE = 64  # bytes in a cache line


@intrinsic
def _prefetch(typingctx, array, row, column):  # pragma: no cover - compiled
    """Ask for the cache line that holds array[row, column] (LLVM's `prefetch`: a read, to every
    cache level); a hint, it changes no value."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        address = cgutils.get_item_pointer(context, builder, array_type, view, args[1:], wraparound=False)
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", [address.type], ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]))
        builder.call(fn, [address, i32(0), i32(3), i32(1)])  # read, keep in every level, data cache
        return context.get_dummy_value()

    return types.void(array, row, column), codegen


@njit(fastmath=_SUM, inline="always")
def _dot1(w, r, s, x, t):  # pragma: no cover - compiled
    """Rows r and s of w dotted with token t of x: (w[r] . x[t], w[s] . x[t])."""
    a0 = b0 = np.float32(0.0)
    for i in range(w.shape[1]):
        x0 = x[t, i]
        a0 += np.float32(w[r, i]) * x0
        b0 += np.float32(w[s, i]) * x0
    return a0, b0


@njit(fastmath=_SUM, inline="always")
def _dot2(w, r, s, x, t):  # pragma: no cover - compiled
    """Rows r and s of w dotted with tokens t, t + 1 of x: (r.t, r.t+1, s.t, s.t+1)."""
    a0 = a1 = b0 = b1 = np.float32(0.0)
    for i in range(w.shape[1]):
        wa, wb, x0, x1 = np.float32(w[r, i]), np.float32(w[s, i]), x[t, i], x[t + 1, i]
        a0 += wa * x0
        a1 += wa * x1
        b0 += wb * x0
        b1 += wb * x1
    return a0, a1, b0, b1


@njit(fastmath=_SUM, inline="always")
def _dot3(w, r, s, x, t):  # pragma: no cover - compiled
    """Rows r and s of w dotted with tokens t .. t + 2 of x: (r.t, r.t+1, r.t+2, s.t, s.t+1, s.t+2)."""
    a0 = a1 = a2 = b0 = b1 = b2 = np.float32(0.0)
    for i in range(w.shape[1]):
        wa, wb, x0, x1, x2 = np.float32(w[r, i]), np.float32(w[s, i]), x[t, i], x[t + 1, i], x[t + 2, i]
        a0 += wa * x0
        a1 += wa * x1
        a2 += wa * x2
        b0 += wb * x0
        b1 += wb * x1
        b2 += wb * x2
    return a0, a1, a2, b0, b1, b2


@njit(inline="always")
def _put(y, scales, b, residual, t, r, s, a, c):  # pragma: no cover - compiled
    """y[t, r] = a * scales[r] + b[r], y[t, s] likewise with c, each plus the residual's entry if it
    has rows (no scales: float weights)."""
    if scales.shape[0] > 0:
        a, c = a * scales[r], c * scales[s]
    a, c = a + b[r], c + b[s]
    if residual.shape[0] > 0:
        a, c = a + residual[t, r], c + residual[t, s]
    y[t, r] = a
    y[t, s] = c


@njit(inline="always")
def _rows(w, scales, b, x, y, residual, r, s):  # pragma: no cover - compiled
    """y[:, r] and y[:, s] for every token, the two rows read once for up to three tokens."""
    n, t = x.shape[0], 0
    while t < n:
        if n - t >= 3:
            a0, a1, a2, c0, c1, c2 = _dot3(w, r, s, x, t)
            _put(y, scales, b, residual, t, r, s, a0, c0)
            _put(y, scales, b, residual, t + 1, r, s, a1, c1)
            _put(y, scales, b, residual, t + 2, r, s, a2, c2)
            t += 3
        elif n - t == 2:
            a0, a1, c0, c1 = _dot2(w, r, s, x, t)
            _put(y, scales, b, residual, t, r, s, a0, c0)
            _put(y, scales, b, residual, t + 1, r, s, a1, c1)
            t += 2
        else:
            a0, c0 = _dot1(w, r, s, x, t)
            _put(y, scales, b, residual, t, r, s, a0, c0)
            t += 1


@njit(cache=True)
def project(weights, x, y, residual, kernel):  # pragma: no cover - compiled
    """y[t, r] = (w[r] . x[t]) * scales[r] + b[r] (+ residual[t, r] if residual has rows).
    weights: (w, scales, b, kind); kernel: the compiled kernel's (project, quantize) addresses
    (`Kernel.calls`), which read every weight (float32 rows or blocks, `blocks.project_native`), or
    `NO_KERNEL`: numba's loops (`_project`: float32 or int8 w)."""
    if kernel[0] != 0:
        blocks.project_native(weights, x, y, residual, kernel)
    else:
        _project(weights, x, y, residual)


NO_KERNEL = (0, 0)  # `project`'s kernel where numba's loops read the weights


@njit(parallel=True, fastmath=_SUM, cache=True)
def _project(weights, x, y, residual):  # pragma: no cover - compiled
    """y[t, r] = (w[r] . x[t]) * scales[r] + b[r] (+ residual[t, r] if residual has rows).
    weights: (w [out, in] float32 or int8, scales [out] (int8) or [0] (float32), b [out]); x [N, in].
    Rows two at a time (two weight streams per thread keep more loads in flight than one), each
    pair's reads preceded by prefetches of the rows `_AHEAD` further on: the hardware alone keeps too
    few lines in flight once the arithmetic per byte grows (several tokens, int8 weights converted
    as read), and memory and arithmetic take turns instead of overlapping (`cpu_profile.md`). Not
    for one token of float32 weights, where the hardware keeps up and prefetching only costs.
    (`step_weights` gives a model's weights in this form, in the order a step reads them.)"""
    w, scales, b, _ = weights
    out, width = w.shape
    for block in prange((out + _BLOCK - 1) // _BLOCK):
        start, end = block * _BLOCK, min(out, block * _BLOCK + _BLOCK)
        paired = end - (end - start) % 2
        if x.shape[0] == 1 and w.itemsize == 4:  # its own loop: prefetching (or testing for it) only costs here
            for r in range(start, paired, 2):
                _rows(w, scales, b, x, y, residual, r, r + 1)
        else:
            for r in range(start, paired, 2):
                if r + _AHEAD + 1 < out:
                    for i in range(0, width, _LINE // w.itemsize):
                        _prefetch(w, r + _AHEAD, i)
                        _prefetch(w, r + _AHEAD + 1, i)
                _rows(w, scales, b, x, y, residual, r, r + 1)
        if paired < end:  # an odd last row, paired with itself
            _rows(w, scales, b, x, y, residual, end - 1, end - 1)


_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)


@njit(fastmath=_SUM, cache=True)
def _exp(x, out, scale):  # pragma: no cover - compiled
    """out = exp(x) for float32 rows x [n], as two loops that vectorise (a libm call per element does
    not, and at a few tokens the attention's and SiLU's exponentials cost a third of a step):
    exp(x) = 2^m * p(r), m = round(x / ln 2), r = x - m ln 2 in [-ln2/2, ln2/2], p its Taylor
    polynomial to r^7 (float32 rounding). x is clamped to [-87, 88], where
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


@njit(cache=True, error_model="numpy")
def _silu_gate(gate_up, act):  # pragma: no cover - compiled
    """act[t, j] = silu(gate[t, j]) * up[t, j]; gate_up [N, 2 * inter]: gate, then up. (The divisor is
    at least 1: no check for zero, which would keep the division from vectorising.)"""
    inter = act.shape[1]
    negated, e, scale = np.empty(inter, np.float32), np.empty(inter, np.float32), np.empty(inter, np.int32)
    for t in range(act.shape[0]):
        gate, up, out = gate_up[t, :inter], gate_up[t, inter:], act[t]  # rows: loops that vectorise
        for j in range(inter):
            negated[j] = -gate[j]
        _exp(negated, e, scale)
        for j in range(inter):
            out[j] = gate[j] / (np.float32(1.0) + e[j]) * up[j]


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


NO_RESIDUAL = np.zeros((0, 0), np.float32)  # `project`'s residual where a projection adds none (no rows)


@njit(cache=True)
def _before_attention(x, cos, sin, norm, eps, qkv_weights, heads, kv_heads, head_dim, kernel):  # pragma: no cover
    """x [N, hidden] -> the joined q/k/v rows [N, (heads + 2 kv_heads) * head_dim], q and k rotated."""
    h = np.empty_like(x)
    _rms_norm(x, norm, eps, h)
    qkv = np.empty((x.shape[0], qkv_weights[0].shape[0]), np.float32)
    project(qkv_weights, h, qkv, NO_RESIDUAL, kernel)
    _rotate(qkv, 0, heads, head_dim, cos, sin)
    _rotate(qkv, heads * head_dim, kv_heads, head_dim, cos, sin)
    return qkv


@njit(cache=True)
def _after_attention(x, attended, out_weights, norm, eps, gate_up_weights, down_weights, kernel):  # pragma: no cover
    """The residual stream x [N, hidden] after the attention output [N, heads * head_dim] and the MLP."""
    y = np.empty_like(x)
    project(out_weights, attended, y, x, kernel)
    h = np.empty_like(x)
    _rms_norm(y, norm, eps, h)
    gate_up = np.empty((x.shape[0], gate_up_weights[0].shape[0]), np.float32)
    project(gate_up_weights, h, gate_up, NO_RESIDUAL, kernel)
    act = np.empty((x.shape[0], gate_up.shape[1] // 2), np.float32)
    _silu_gate(gate_up, act)
    out = np.empty_like(x)
    project(down_weights, act, out, y, kernel)
    return out


@njit(cache=True)
def _head(x, norm, eps, weights, kernel):  # pragma: no cover - compiled
    """Final norm and output layer: x [N, hidden] -> logits [N, vocab]."""
    h = np.empty_like(x)
    _rms_norm(x, norm, eps, h)
    logits = np.empty((x.shape[0], weights[0].shape[0]), np.float32)
    project(weights, h, logits, NO_RESIDUAL, kernel)
    return logits


@njit(fastmath=_SUM, cache=True)
def _join(tops, totals, sums, out):  # pragma: no cover - compiled
    """Each token's and head's attention from its spans' softmax parts: tops, totals [N, heads, spans]
    (max score, sum of exp(score - max)), sums [N, heads, spans, head_dim] (values weighted so)."""
    n, heads, spans, head_dim = sums.shape
    for t in range(n):
        for h in range(heads):
            top = tops[t, h, 0]
            for span in range(1, spans):
                top = max(top, tops[t, h, span])
            o = out[t, h * head_dim : (h + 1) * head_dim]
            total = np.float32(0.0)
            for d in range(head_dim):
                o[d] = np.float32(0.0)
            for span in range(spans):
                if tops[t, h, span] > -np.inf:  # a span with nothing seen adds nothing
                    f = np.exp(tops[t, h, span] - top)  # 1 for the span that holds the maximum
                    total += f * totals[t, h, span]
                    for d in range(head_dim):
                        o[d] += f * sums[t, h, span, d]
            for d in range(head_dim):
                o[d] /= total


@njit(cache=True)
def _attention_share(part, parts, kv_heads, spans, chunks, size, queries, kv, width):  # pragma: no cover - compiled
    """The kernel's attention jobs [start, end) that thread share `part` of `parts` computes: the jobs
    in their order (kv head, span, chunk of `size` of its `queries`), each weighing its queries times
    its span's entries (the last span of `kv` entries is partly filled), in shares of about equal
    weight (a job goes to the share its middle falls in). Equal numbers of jobs were not equal work:
    with two spans, the one full and the other nearly empty, one thread took twice the other's."""
    total = kv_heads * kv * queries
    done = start = end = 0
    for _ in range(kv_heads):
        for span in range(spans):
            entries = min(width, kv - span * width)
            for chunk in range(chunks):
                weight = entries * min(size, queries - chunk * size)
                share = (2 * done + weight) * parts // (2 * total)
                start += share < part
                end += share <= part
                done += weight
    return start, end


@njit(parallel=True, fastmath=_SUM, cache=True)
def attend(qkv, rows, positions, visible, keys, values, heads, kv_heads, head_dim, out, kernel, threads):  # pragma: no cover
    """Write each token's k and v into its row's cache at its position, then attention: out [N, heads *
    head_dim]. qkv [N, (heads + 2 kv_heads) * head_dim] (q, k rotated); rows, positions [N]: each
    token's row in the window and position; visible [N, kv] bool (which cache entries each token
    sees); keys, values [batch, kv_heads, capacity, head_dim]: this layer's, the window's rows.
    kernel: the compiled kernel's `specdraft_attend` address (`attention_kernel`), or 0: numba's loops;
    threads: the threads the kernel's jobs are shared among (`_attention_share`; numba's own thread
    count, read in here, would keep numba from caching this function).

    A job is queries that share a kv head (and its key and value loads; the kernel's: up to
    `blocks.MAX_JOB_QUERIES` (token, query head) pairs, `blocks.job_queries`; numba's loops': one
    token's query heads) over a span of `SPAN` cache entries at a fixed offset (flash-decoding's
    split, fixed so that a token's result does not depend on the pass), each span's softmax kept as (max, sum, weighted values) and
    joined after in order. Either way one order of arithmetic per (token, head, span): the kernel's
    (attention.cpp states it), or numba's loops'."""
    n, kv = qkv.shape[0], visible.shape[1]
    group = heads // kv_heads
    scale = np.float32(1.0 / np.sqrt(head_dim))
    for t in range(n):  # all writes first: a row's tokens in this pass see each other
        for g in range(kv_heads):
            key, value = keys[rows[t], g, positions[t]], values[rows[t], g, positions[t]]  # [head_dim] views
            k, v = (heads + g) * head_dim, (heads + kv_heads + g) * head_dim
            for d in range(head_dim):
                key[d] = qkv[t, k + d]
                value[d] = qkv[t, v + d]
    # Spans at fixed offsets (0, SPAN, 2 SPAN, ...), each computed over its whole width: a token's
    # keys are split, and every span's sums run, the same way whatever pass the token is in.
    width = SPAN
    spans = (kv + width - 1) // width
    assert spans * width <= keys.shape[2], "the cache's capacity is a whole number of spans"
    # Every job fills its own (token, head, span) entries; no array expressions here (in a parallel
    # function numba would run each as a parallel loop of its own).
    tops = np.empty((n, heads, spans), np.float32)
    totals = np.empty((n, heads, spans), np.float32)
    sums = np.empty((n, heads, spans, head_dim), np.float32)
    if kernel != 0:  # a job per span and chunk of a kv head's (token, query head) pairs; the jobs shared by work
        size = blocks.job_queries(n * group)
        chunks = (n * group + size - 1) // size
        parts = max(1, min(threads, kv_heads * spans * chunks))
        for part in prange(parts):  # the Attention made here: a parallel loop takes none in
            start, end = _attention_share(part, parts, kv_heads, spans, chunks, size, n * group, kv, width)
            attention = blocks.Attention(
                qkv=qkv.ctypes.data, qkv_stride=qkv.shape[1], rows=rows.ctypes.data, visible=visible.ctypes.data,
                kv=kv, keys=keys.ctypes.data, values=values.ctypes.data, capacity=keys.shape[2], heads=heads,
                kv_heads=kv_heads, head_dim=head_dim, span=width, spans=spans, tokens=n, tops=tops.ctypes.data,
                totals=totals.ctypes.data, sums=sums.ctypes.data)
            blocks.call(kernel, attention, start, end)
        _join(tops, totals, sums, out)
        return
    for job in prange(n * kv_heads * spans):  # tokens fastest: a thread's jobs reuse one span of the cache
        t, span, g = job % n, (job // n) % spans, job // (n * spans)
        first = span * width
        seen = np.zeros(width, np.bool_)
        for j in range(min(width, kv - first)):
            seen[j] = visible[t, first + j]
        k, v = keys[rows[t], g, first : first + width], values[rows[t], g, first : first + width]  # [span, head_dim]
        scores = np.full((group, width), -np.inf, np.float32)
        top = np.full(group, -np.inf, np.float32)
        for j in range(width):
            if seen[j]:
                kj = k[j]
                for u in range(group):
                    # Slices, so that the inner loops index from 0 and vectorise.
                    query = qkv[t, (g * group + u) * head_dim : (g * group + u + 1) * head_dim]
                    acc = np.float32(0.0)
                    for d in range(head_dim):
                        acc += query[d] * kj[d]
                    scores[u, j] = acc * scale
                    top[u] = max(top[u], scores[u, j])
        weights, scratch = np.empty((group, width), np.float32), np.empty(width, np.int32)
        for u in range(group):
            if top[u] > -np.inf:  # a span with nothing seen adds nothing
                for j in range(width):
                    scores[u, j] -= top[u]  # unseen entries (-inf) get weights that are never read
                _exp(scores[u], weights[u], scratch)
        total = np.zeros(group, np.float32)
        attended = np.zeros((group, head_dim), np.float32)
        for j in range(width):
            if seen[j]:
                vj = v[j]
                for u in range(group):
                    e = weights[u, j]
                    total[u] += e
                    row = attended[u]
                    for d in range(head_dim):
                        row[d] += e * vj[d]
        for u in range(group):
            h = g * group + u
            tops[t, h, span], totals[t, h, span] = top[u], total[u]
            for d in range(head_dim):
                sums[t, h, span, d] = attended[u, d]
    _join(tops, totals, sums, out)


@njit(cache=True)
def _stack(x, cos, sin, rows, positions, visible, keys, values, before, after, eps, heads, kv_heads,
           head_dim, kernel, attention, threads):  # pragma: no cover - compiled
    """Every layer on x [N, hidden]: q/k/v, cache writes, attention, output projection and MLP.
    before[i]: (norm, q/k/v weights); after[i]: `_after_attention`'s weights but the norm's eps;
    eps [layers, 2]; kernel: `project`'s; attention, threads: `attend`'s kernel and threads. Returns
    the stream after the last layer."""
    attended = np.empty((x.shape[0], heads * head_dim), np.float32)
    for i in range(len(before)):
        norm, qkv_weights = before[i]
        qkv = _before_attention(x, cos, sin, norm, eps[i, 0], qkv_weights, heads, kv_heads, head_dim, kernel)
        attend(qkv, rows, positions, visible, keys[i], values[i], heads, kv_heads, head_dim, attended, attention, threads)
        out_weights, norm2, gate_up_weights, down_weights = after[i]
        x = _after_attention(x, attended, out_weights, norm2, eps[i, 1], gate_up_weights, down_weights, kernel)
    return x


def _named(name: str):
    """The call's name in a torch profile, where a profiler runs; nothing otherwise (entering a
    `record_function`, profiler or not, cost a CPU step ~0.09 ms a call)."""
    return torch.profiler.record_function(name) if torch._C._autograd._profiler_enabled() else contextlib.nullcontext()


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _weights(linear: tuple, native: bool) -> tuple:
    """(weight, bias or None, scales or None), as `weights.projection` gives it -> `project`'s
    (weight (a view), float32 scales (none: [0]), bias (none: zeros), kind). `native`: for the
    compiled kernel, the weight as its bytes [out, row bytes] (kind F32), else as it is (kind -1)."""
    weight, bias, scales = linear
    w = _array(weight)
    return (w.view(np.uint8) if native else w, np.zeros(0, np.float32) if scales is None else _array(scales.float()),
            np.zeros(weight.shape[0], np.float32) if bias is None else _array(bias.float()), blocks.F32 if native else -1)


def _group_weights(group: list[torch.nn.Module], native: bool) -> tuple:
    """`project`'s weights of a group of linears read as one projection (q/k/v, gate/up, or one)."""
    assert native or not any(isinstance(m, blocks.BlockLinear) for m in group), "numba's loops read no GGUF blocks"
    if all(isinstance(m, blocks.BlockLinear) for m in group) and len({m.kind for m in group}) == 1:
        tensors = [m.blocks for m in group]
        joined = adjacent_view(tensors)
        joined = torch.cat(tensors) if joined is None else joined
        return joined.numpy(), np.zeros(0, np.float32), np.zeros(joined.shape[0], np.float32), group[0].kind
    if any(isinstance(m, blocks.BlockLinear) for m in group):  # blocks of several kinds: read as float32
        weight = torch.cat([m.dense() if isinstance(m, blocks.BlockLinear) else m.weight.detach() for m in group])
        return _weights((weight, None, None), native)
    return _weights(joined_projection(group), native)


_HUGE_PAGE = 2 << 20


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of `nbytes` in anonymous memory, 2 MB aligned, that the kernel is asked
    to back with 2 MB pages (`MADV_HUGEPAGE`, before any page is touched; where it does not, plain
    pages). Streaming the weights from 4 KB pages costs a page walk every 4 KB, which 2 MB pages
    spare (`benchmarks/results/cpu_profile.md`)."""
    area = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            area.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # transparent huge pages not configured: plain pages
            pass
    raw = np.frombuffer(area, np.uint8)  # keeps `area` alive as long as a view of it lives
    start = (-raw.ctypes.data) % _HUGE_PAGE
    return raw[start : start + nbytes]


def _read_name(module: torch.nn.Module) -> str:
    """The attribute holding what a step reads of a linear: its GGUF blocks or its weight."""
    return "blocks" if isinstance(module, blocks.BlockLinear) else "weight"


def _on_huge_pages(model: torch.nn.Module, groups: list[list[torch.nn.Module]]) -> None:
    """Move these linears' weights (or blocks) into one `huge_page_buffer`, each group's adjacent
    (its joined projection is then a view) and the groups in the order given (the order a step reads
    them). Each module's tensor becomes a view of the buffer holding the same values (a tied input
    embedding follows the output layer), so the loader's memory is freed, not kept twice. Tensors
    moved already (another step built over the same layers) stay where they are."""
    groups = [g for g in groups if not all(getattr(getattr(m, _read_name(m)), "_on_huge_pages", False) for m in g)]
    if not groups:
        return
    tensors = [[getattr(m, _read_name(m)) for m in g] for g in groups]
    nbytes = [sum(t.numel() * t.element_size() for t in g) for g in tensors]
    sizes = [-(-n // 4096) * 4096 for n in nbytes]  # 4 KB aligned each
    buffer, offset = huge_page_buffer(sum(sizes)), 0
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        for group, olds, n, size in zip(groups, tensors, nbytes, sizes):
            first = olds[0]
            joined = torch.from_numpy(buffer[offset : offset + n]).view(first.dtype).view(-1, first.shape[1])
            start = 0
            for m, old in zip(group, olds):
                view = joined[start : start + old.shape[0]]
                if isinstance(old, torch.nn.Parameter):  # a parameter stays one, a buffer (int8 weights) a buffer
                    view = torch.nn.Parameter(view, requires_grad=old.requires_grad)
                view.copy_(old)
                view._on_huge_pages = True
                setattr(m, _read_name(m), view)
                if embedding is not None and getattr(embedding, _read_name(m), None) is old:
                    setattr(embedding, _read_name(m), view)
                start += old.shape[0]
            offset += size


def step_weights(model: torch.nn.Module, layers: list[torch.nn.Module], native: bool = False) -> list[tuple]:
    """`project`'s weights of every projection of `layers` and of the output layer, in the order a
    step reads them (q/k/v joined, output, gate/up joined, down; per layer). `native`: as the
    compiled kernel reads them (bytes of float32 rows or GGUF blocks), else as numba's loops do."""
    return [_group_weights(g, native) for layer in layers for g in projections(layer)] + \
        [_group_weights([model.lm_head], native)]


def native_kernel(model: torch.nn.Module, layers: list[torch.nn.Module]) -> blocks.Kernel | None:
    """The compiled kernel where it reads these layers' weights (float32 rows or GGUF blocks), or None
    where numba's loops do (int8 weights, or no kernel on this machine): `blocks.reader` decides."""
    return blocks.kernel() if linears_reader(model, layers) is blocks.Reader.KERNEL else None


def attention_kernel(heads: int, kv_heads: int, head_dim: int) -> int:
    """`attend`'s kernel: the compiled kernel's `specdraft_attend` where it compiles and takes this
    shape (head_dim a multiple of 16), else 0: numba's loops."""
    fits = head_dim % 16 == 0 and SPAN <= blocks.MAX_SPAN
    return blocks.kernel().attend_address if fits and blocks.kernel_problem() is None else 0


class NumbaLayers:
    """The per-token parts of `layers` (a model's decoder layers), attention over a `RowKVCache`
    and the output head, as numba kernels over the model's own weights: moved once, when these
    layers are built, onto 2 MB pages in the order a step reads them, q/k/v and gate/up adjacent (one
    buffer each); the model's modules keep using them (views, nothing kept twice)."""

    max_tokens = MAX_TOKENS

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], head_dim: int, heads: int,
                 kv_heads: int) -> None:
        self._shape = (heads, kv_heads, head_dim)
        _on_huge_pages(model, [g for layer in layers for g in projections(layer)] + [[model.lm_head]])
        native = native_kernel(model, layers)
        self.arithmetic = linears_arithmetic(model, layers)
        self._kernel = NO_KERNEL if native is None else native.calls(self.arithmetic)
        self.attention_address = attention_kernel(heads, kv_heads, head_dim)  # `attend`'s kernel (0: numba's loops)
        weights = step_weights(model, layers, native=native is not None)
        before, after, eps = List(), List(), []
        for i, layer in enumerate(layers):
            qkv, out, gate_up, down = weights[4 * i : 4 * i + 4]
            before.append((_array(layer.input_layernorm.weight), qkv))
            after.append((out, _array(layer.post_attention_layernorm.weight), gate_up, down))
            eps.append((norm_eps(layer.input_layernorm), norm_eps(layer.post_attention_layernorm)))
        self._before, self._after, self._eps = before, after, np.array(eps, dtype=np.float64)  # eps [layers, 2]
        self._head = (_array(model.model.norm.weight), norm_eps(model.model.norm), weights[-1], self._kernel)
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
        self.head(self._run(x, rotary, rotary, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                            torch.ones(1, 1, dtype=torch.bool), cache))
        self._buffers = (None, None, None)  # hold no reference to the warm-up cache

    def use_kernel_build(self, path: str) -> None:
        """Run on another build of the compiled kernel (`blocks.PATHS`), for a benchmark to compare:
        every build gives bitwise the same sums. Only where the kernel reads the weights."""
        assert self._kernel != NO_KERNEL, "numba's loops read these weights"
        built = blocks.kernel(path)
        self._kernel = built.calls(self.arithmetic)
        self._head = (*self._head[:3], self._kernel)
        if self.attention_address:
            self.attention_address = built.attend_address

    @staticmethod
    def applies(model: torch.nn.Module, layers: list[torch.nn.Module], dtype: torch.dtype) -> bool:
        """Whether the layers are plain (SiLU MLP, RMS norms) on CPU, with float32 activations, and
        their linears read by the compiled kernel or numba's loops (`blocks.reader`: all float32 or
        GGUF blocks where the kernel compiles, else all float32 or all int8 `Int8Linear`s)."""
        if model_device(model).type != "cpu" or dtype != torch.float32:
            return False
        read = linears_reader(model, layers) in (blocks.Reader.KERNEL, blocks.Reader.NUMBA)
        return all(silu_mlp(layer.mlp) for layer in layers) and read

    def takes(self, tokens: int) -> bool:
        """Whether a pass of this many tokens runs here: every pass where `LONG_PASSES` or the int8
        arithmetic (a longer one in calls of `MAX_TOKENS` tokens, each token computed as a decode step
        computes it), else up to `MAX_TOKENS` (longer ones run the eager layers)."""
        return LONG_PASSES or self.arithmetic == "int8" or tokens <= MAX_TOKENS  # the eager layers have no int8

    def stack(self, p: Pass) -> torch.Tensor:
        """Every layer on the pass's tokens, attention and cache writes included, in one call per
        `MAX_TOKENS` tokens: a longer pass (a prefill chunk) runs as passes of that many in turn, so
        that each of its tokens is computed exactly as a decode or verify step computes it (each
        call writes its tokens' keys and values before attending: later calls see them)."""
        flat = torch.arange(p.batch * p.steps) if p.real is None else p.real  # [N] into [batch * T]
        x, cos, sin = p.x, p.flat(p.cos), p.flat(p.sin)
        rows, positions = flat // p.steps, p.positions.reshape(-1)[flat]
        visible = p.mask[:, 0].reshape(p.batch * p.steps, -1)[flat]  # [N, kv]
        parts = [self._run(x[i : i + MAX_TOKENS], cos[i : i + MAX_TOKENS], sin[i : i + MAX_TOKENS],
                           rows[i : i + MAX_TOKENS], positions[i : i + MAX_TOKENS], visible[i : i + MAX_TOKENS], p.cache)
                 for i in range(0, len(flat), MAX_TOKENS)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

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

    def _run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
             visible: torch.Tensor, cache: RowKVCache) -> torch.Tensor:
        """Every layer on the tokens x [N, hidden]: cos, sin [N, head_dim]; rows, positions [N] (each
        token's row in the cache's prepared window, its position); visible [N, kv] bool (which cache
        entries each token sees). Writes the tokens' keys and values; returns the stream [N, hidden]."""
        assert cache.dtype == torch.float32 and cache.num_layers == len(self._before)
        self.use_torch_threads()
        keys, values = self._cache(cache)
        with _named("specdraft::numba_stack"):
            x = _stack(_array(x), _array(cos), _array(sin), _array(rows), _array(positions), _array(visible),
                       keys, values, self._before, self._after, self._eps, *self._shape, self._kernel,
                       self.attention_address, numba.get_num_threads())
        return torch.from_numpy(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, hidden] -> float32 logits [N, vocab]."""
        self.use_torch_threads()
        with _named("specdraft::numba_head"):
            return torch.from_numpy(_head(_array(x), *self._head))
