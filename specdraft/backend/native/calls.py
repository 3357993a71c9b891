"""Calling the compiled kernel from numba: its two structs as named tuples (`Projection`, `Attention`:
the C structs' fields in their order), `call` (a C function by address, the struct by address), and
the parallel loops that call it (`project_native`, a projection; `project_blocks`, some of its rows;
`expand`, blocks to float32 rows)."""

from __future__ import annotations

from collections import namedtuple

from llvmlite import ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from specdraft.backend.native.formats import BF16, BLOCK, F16, F32

Projection = namedtuple("Projection", ["kind", "w", "rows", "row_bytes", "width", "x", "n", "xs", "y", "ys", "bias",
                                       "residual", "rs", "qx", "xd", "xsum", "xtotal"])
Projection.__doc__ = """What a call of the kernel computes, y[t, r] = (w[r] . x[t] + bias[r]) (+ residual[t, r]):
csrc/projection.h's `Projection`, the same fields in the same order (`Kernel.offset` reads where it holds
each), every one an integer (pointers as integers, 0 for none). kind: F32 or a block kind (`KINDS`); w
[rows, row_bytes] float32 rows or blocks; width: weights in a row; x [n, xs]; y [n, ys]; bias [out];
residual [n, rs] or 0; qx [n, width] int8, xd, xsum (float32), xtotal (int32) [n, width / 32]: the
tokens quantised for the int8 arithmetic, per 32 (a K kind's per 256: xd its super-block's scale for
each of its 32s; Q6_K's xtotal the sums of each 32's two 16s, as int16 halves; `specdraft_quantize`
writes them; w is then tiles, `Kernel.tile`), or 0: float32 arithmetic."""


Attention = namedtuple("Attention", ["qkv", "qkv_stride", "rows", "visible", "kv", "keys", "values", "table",
                                     "table_stride", "heads", "kv_heads", "head_dim", "span", "spans", "tokens", "tops", "totals", "sums"])
Attention.__doc__ = """A layer's attention over a pass (`numba_layers.attention.attend`): csrc/attention.cpp's
`Attention`, the same fields in the same order (`Kernel.offset(field, "attention")`), every one an integer. qkv [n,
qkv_stride] float32 (q heads, k, v); rows [n] int64; visible [n, kv] bool; keys, values [pages,
kv_heads, span, head_dim] float32 (head_dim a multiple of 16); table [rows, table_stride] int64: each row's
page for each span; span, spans: the entries a job (and a page) holds and how many spans; tokens: n; tops, totals [n, heads, spans], sums [n, heads, spans, head_dim] float32: what each
job writes (attention.cpp says how it sums)."""
MAX_SPAN = 256  # attention.cpp's kMaxSpan
MAX_JOB_QUERIES = 6  # attention.cpp's kMaxQueries: the (token, query head) pairs of one kv head a job takes at most


@njit(cache=True)
def job_queries(queries):  # pragma: no cover - compiled
    """attention.cpp's `job_queries`: the queries a job takes of a kv head's `queries` (tokens * group),
    at most MAX_JOB_QUERIES, and two jobs where there are two queries or more."""
    return min((queries + 1) // 2, MAX_JOB_QUERIES)


@intrinsic
def call(typingctx, address, projection, start, end):  # pragma: no cover - compiled
    """Call the C function at `address` (`specdraft_project`, `specdraft_quantize` or
    `specdraft_expand`: rows or tokens [start, end) of `projection`, a `Projection`; `specdraft_attend`:
    jobs [start, end) of an `Attention`), which it reads by address as the C struct. A call by
    address, so a cached caller holds no process's addresses."""
    if not (isinstance(projection, types.BaseNamedTuple) and projection.instance_class in (Projection, Attention)):
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fields = signature.args[1].types
        struct = cgutils.alloca_once(builder, ir.ArrayType(i64, len(fields)))  # in the caller's entry block
        for i, (value, t) in enumerate(zip(cgutils.unpack_tuple(builder, args[1]), fields)):
            builder.store(context.cast(builder, value, t, types.int64), cgutils.gep_inbounds(builder, struct, 0, i))
        rows = [context.cast(builder, v, t, types.int64) for v, t in zip(args[2:], signature.args[2:])]
        function = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64),
                                    ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64, i64]).as_pointer())
        builder.call(function, [builder.bitcast(struct, i64.as_pointer()), *rows])
        return context.get_dummy_value()

    return types.void(address, projection, start, end), codegen


_ROWS = 16  # rows a work item of `expand` and `project_native` takes


@njit(parallel=True, cache=True)
def expand(w, kind, y, kernel):  # pragma: no cover - compiled
    """y [out, width] = the float32 values of w [out, row bytes] (blocks of `kind`), by the compiled
    kernel's `specdraft_expand` at address `kernel`, blocks of rows among the threads."""
    out = w.shape[0]
    for block in prange((out + _ROWS - 1) // _ROWS):  # the Projection made here: a parallel loop takes none in
        projection = Projection(kind=kind, w=w.ctypes.data, rows=out, row_bytes=w.shape[1], width=y.shape[1], x=0,
                                n=0, xs=0, y=y.ctypes.data, ys=y.shape[1], bias=0, residual=0, rs=0, qx=0, xd=0,
                                xsum=0, xtotal=0)
        call(kernel, projection, block * _ROWS, min(out, block * _ROWS + _ROWS))


@njit(inline="always")
def _quantized(x, width, kind, quantize):  # pragma: no cover - compiled
    """The tokens x [n, width] quantised for the int8 arithmetic by `specdraft_quantize` at address
    `quantize` (0: the float32 arithmetic, or float32 weights: empty arrays): (q, d, s, totals), as
    `Projection`'s qx, xd, xsum, xtotal (F16's and BF16's q: the tokens rounded, as float32 bytes)."""
    n = x.shape[0]
    int8 = quantize != 0 and kind != F32
    floats = kind == F16 or kind == BF16  # its tokens rounded, float32: 4 bytes a value
    q = np.empty((n if int8 else 0, width * 4 if floats else width), np.int8)
    d = np.empty((n if int8 else 0, width // BLOCK), np.float32)
    s = np.empty_like(d)
    totals = np.empty(d.shape, np.int32)
    if int8:
        call(quantize, Projection(kind=kind, w=0, rows=0, row_bytes=0, width=width, x=x.ctypes.data, n=n, xs=x.shape[1],
                                  y=0, ys=0, bias=0, residual=0, rs=0, qx=q.ctypes.data, xd=d.ctypes.data,
                                  xsum=s.ctypes.data, xtotal=totals.ctypes.data), 0, n)
    return q, d, s, totals


@njit(parallel=True, cache=True)
def project_native(weights, x, y, residual, kernel):  # pragma: no cover - compiled
    """y[t, r] = w[r] . x[t] + b[r] (+ residual[t, r] if residual has rows) by the compiled kernel
    (csrc/entry.cpp; kernel: its (project, quantize) addresses, `Kernel.calls`, quantize 0 for the
    float32 arithmetic). weights: (w [out, row bytes] uint8, float32 rows or GGUF blocks of `kind`,
    unused, b [out], kind); one call per block of rows, the blocks among the threads. With the int8
    arithmetic, w is the blocks as tiles (`Kernel.tile`), read against the tokens quantised once, first."""
    w, _, b, kind = weights
    address, quantize = kernel
    out, n, width = w.shape[0], x.shape[0], x.shape[1]
    # Row strides in floats, not widths: y (and a residual) may be a block of another array's columns.
    r, rs = (residual.ctypes.data, residual.strides[0] // 4) if residual.shape[0] > 0 else (0, 0)
    q, d, s, totals = _quantized(x, width, kind, quantize)
    int8 = q.shape[0] > 0
    # The quantised tokens' addresses are taken inside the loop, so that the loop holds their arrays:
    # an address taken before it is a plain integer, and numba may free an array after its last use
    # as an array, before the threads read it (which reads freed memory, and on a thread other than
    # the main one, memory the allocator has already handed out again).
    for block in prange((out + _ROWS - 1) // _ROWS):  # the Projection made here: a parallel loop takes none in
        qx, xd, xsum, xtotal = (q.ctypes.data, d.ctypes.data, s.ctypes.data, totals.ctypes.data) if int8 else (0, 0, 0, 0)
        projection = Projection(kind=kind, w=w.ctypes.data, rows=out, row_bytes=w.shape[1], width=width,
                                x=x.ctypes.data, n=n, xs=x.shape[1], y=y.ctypes.data, ys=y.strides[0] // 4,
                                bias=b.ctypes.data, residual=r, rs=rs, qx=qx, xd=xd, xsum=xsum, xtotal=xtotal)
        call(address, projection, block * _ROWS, min(out, block * _ROWS + _ROWS))


@njit(parallel=True, cache=True)
def project_blocks(weights, x, y, blocks, kernel):  # pragma: no cover - compiled
    """`project_native` for the rows of the given blocks only (blocks: indices of _ROWS-row blocks,
    a row r in block r // _ROWS), y [n, out] written at those rows' columns, the others untouched:
    each row's sum is the one the whole projection gives it, bitwise (the same call on the same rows)."""
    w, _, b, kind = weights
    address, quantize = kernel
    out, n, width = w.shape[0], x.shape[0], x.shape[1]
    q, d, s, totals = _quantized(x, width, kind, quantize)
    int8 = q.shape[0] > 0
    for i in prange(blocks.shape[0]):  # addresses taken inside the loop: see `project_native`
        qx, xd, xsum, xtotal = (q.ctypes.data, d.ctypes.data, s.ctypes.data, totals.ctypes.data) if int8 else (0, 0, 0, 0)
        projection = Projection(kind=kind, w=w.ctypes.data, rows=out, row_bytes=w.shape[1], width=width,
                                x=x.ctypes.data, n=n, xs=x.shape[1], y=y.ctypes.data, ys=y.strides[0] // 4,
                                bias=b.ctypes.data, residual=0, rs=0, qx=qx, xd=xd, xsum=xsum, xtotal=xtotal)
        call(address, projection, blocks[i] * _ROWS, min(out, blocks[i] * _ROWS + _ROWS))
