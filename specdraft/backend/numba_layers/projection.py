"""A projection of a pass's tokens, y[t, r] = (w[r] . x[t]) * scales[r] + b[r] (+ residual[t, r]):
by the compiled kernel where it reads the weights (float32 rows or GGUF blocks, `native.project_native`),
else by numba's own loops (`_project`: float32 or int8 rows)."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from specdraft.backend import native
from specdraft.backend.numba_layers.elementwise import SUM

_BLOCK = 16  # weight rows per parallel work item
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


@njit(fastmath=SUM, inline="always")
def _dot1(w, r, s, x, t):  # pragma: no cover - compiled
    """Rows r and s of w dotted with token t of x: (w[r] . x[t], w[s] . x[t])."""
    a0 = b0 = np.float32(0.0)
    for i in range(w.shape[1]):
        x0 = x[t, i]
        a0 += np.float32(w[r, i]) * x0
        b0 += np.float32(w[s, i]) * x0
    return a0, b0


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
    """y[:, r] and y[:, s] for every token, one token at a time: each token's sums are the one loop's
    (`_dot1`), whatever tokens share the pass. (Two or three tokens a loop read the rows fewer times,
    but the compiler spreads their sums over the vector lanes otherwise than one token's: a token's
    result then depends on its neighbours.) The two rows stay in cache from one token to the next."""
    for t in range(x.shape[0]):
        a0, c0 = _dot1(w, r, s, x, t)
        _put(y, scales, b, residual, t, r, s, a0, c0)


@njit(cache=True)
def project(weights, x, y, residual, kernel):  # pragma: no cover - compiled
    """y[t, r] = (w[r] . x[t]) * scales[r] + b[r] (+ residual[t, r] if residual has rows).
    weights: (w, scales, b, kind); kernel: the compiled kernel's (project, quantize) addresses
    (`Kernel.calls`), which read every weight (float32 rows or blocks, `native.project_native`), or
    `NO_KERNEL`: numba's loops (`_project`: float32 or int8 w)."""
    if kernel[0] != 0:
        native.project_native(weights, x, y, residual, kernel)
    else:
        _project(weights, x, y, residual)


NO_KERNEL = (0, 0)  # `project`'s kernel where numba's loops read the weights


@njit(parallel=True, fastmath=SUM, cache=True)
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


NO_RESIDUAL = np.zeros((0, 0), np.float32)  # `project`'s residual where a projection adds none (no rows)
