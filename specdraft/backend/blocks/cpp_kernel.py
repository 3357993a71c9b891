"""The compiled kernel, `blocks.cpp` (projections over float32 rows or GGUF blocks, one order of
arithmetic for both): compiled at first use by the machine's C++ compiler (the one torch's inductor
needs) for this machine's instructions, cached under the cache dir, loaded, and called from numba's
parallel loops by address with a `Projection`."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections import namedtuple
from pathlib import Path

from llvmlite import ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from specdraft.backend.blocks.format import BLOCK, F32
from specdraft.params import cache_dir

# Beside the package, where the package data puts them: the projections, and the CPU step's attention.
SOURCES = (Path(__file__).parent.parent / "blocks.cpp", Path(__file__).parent.parent / "attention.cpp")
HEADERS = (Path(__file__).parent.parent / "for_count.h",)  # what the sources include: part of a build's key

Projection = namedtuple("Projection", ["kind", "w", "rows", "row_bytes", "width", "x", "n", "xs", "y", "ys", "bias",
                                       "residual", "rs", "qx", "xd", "xsum", "xtotal"])
Projection.__doc__ = """What a call of the kernel computes, y[t, r] = (w[r] . x[t] + bias[r]) (+ residual[t, r]):
blocks.cpp's `Projection`, the same fields in the same order (`Kernel.offset` reads where it holds
each), every one an integer (pointers as integers, 0 for none). kind: F32, Q4_1 or Q8_0; w [rows,
row_bytes] float32 rows or blocks; width: weights in a row; x [n, xs]; y [n, ys]; bias [out];
residual [n, rs] or 0; qx [n, width] int8, xd, xsum (float32), xtotal (int32) [n, width / 32]: the
tokens quantised for the int8 arithmetic (`specdraft_quantize` writes them; w is then tiles,
`Kernel.tile`), or 0: float32 arithmetic."""


Attention = namedtuple("Attention", ["qkv", "qkv_stride", "rows", "visible", "kv", "keys", "values", "capacity",
                                     "heads", "kv_heads", "head_dim", "span", "spans", "tokens", "tops", "totals", "sums"])
Attention.__doc__ = """A layer's attention over a pass (`numba_layers.attend`): attention.cpp's `Attention`, the
same fields in the same order (`Kernel.offset(field, "attention")`), every one an integer. qkv [n,
qkv_stride] float32 (q heads, k, v); rows [n] int64; visible [n, kv] bool; keys, values [rows,
kv_heads, capacity, head_dim] float32 (head_dim a multiple of 16); span, spans: the entries a job reads
and how many spans; tokens: n; tops, totals [n, heads, spans], sums [n, heads, spans, head_dim] float32: what each
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


TILE_ROWS = 8  # rows a tile of the int8 arithmetic interleaves (blocks.cpp's kTileRows)
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


@njit(parallel=True, cache=True)
def project_native(weights, x, y, residual, kernel):  # pragma: no cover - compiled
    """y[t, r] = w[r] . x[t] + b[r] (+ residual[t, r] if residual has rows) by the compiled kernel
    (`blocks.cpp`; kernel: its (project, quantize) addresses, `Kernel.calls`, quantize 0 for the
    float32 arithmetic). weights: (w [out, row bytes] uint8, float32 rows or GGUF blocks of `kind`,
    unused, b [out], kind); one call per block of rows, the blocks among the threads. With the int8
    arithmetic, w is the blocks as tiles (`Kernel.tile`), read against the tokens quantised once, first."""
    w, _, b, kind = weights
    address, quantize = kernel
    out, n, width = w.shape[0], x.shape[0], x.shape[1]
    r, rs = (residual.ctypes.data, residual.shape[1]) if residual.shape[0] > 0 else (0, 0)
    int8 = quantize != 0 and kind != F32
    q = np.empty((n if int8 else 0, width), np.int8)
    d = np.empty((n if int8 else 0, width // BLOCK), np.float32)
    s = np.empty_like(d)
    totals = np.empty(d.shape, np.int32)
    if int8:
        call(quantize, Projection(kind=kind, w=0, rows=0, row_bytes=0, width=width, x=x.ctypes.data, n=n, xs=x.shape[1],
                                  y=0, ys=0, bias=0, residual=0, rs=0, qx=q.ctypes.data, xd=d.ctypes.data,
                                  xsum=s.ctypes.data, xtotal=totals.ctypes.data), 0, n)
    # The quantised tokens' addresses are taken inside the loop, so that the loop holds their arrays:
    # an address taken before it is a plain integer, and numba may free an array after its last use
    # as an array, before the threads read it (which reads freed memory, and on a thread other than
    # the main one, memory the allocator has already handed out again).
    for block in prange((out + _ROWS - 1) // _ROWS):  # the Projection made here: a parallel loop takes none in
        qx, xd, xsum, xtotal = (q.ctypes.data, d.ctypes.data, s.ctypes.data, totals.ctypes.data) if int8 else (0, 0, 0, 0)
        projection = Projection(kind=kind, w=w.ctypes.data, rows=out, row_bytes=w.shape[1], width=width,
                                x=x.ctypes.data, n=n, xs=x.shape[1], y=y.ctypes.data, ys=y.shape[1],
                                bias=b.ctypes.data, residual=r, rs=rs, qx=qx, xd=xd, xsum=xsum, xtotal=xtotal)
        call(address, projection, block * _ROWS, min(out, block * _ROWS + _ROWS))


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _machine() -> str:
    """What `-march=native` compiles for here: the CPU's model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "\n".join(lines)


# What a build may run: the best this CPU has, that in 256-bit registers only, AVX2 alone, loops.
PATHS = ("native", "ymm", "avx2", "portable")


def build(path: str = "native") -> Path:
    """Compile blocks.cpp (with attention.cpp) for this machine, once per source, compiler and CPU;
    return the shared library's path. `path`: "native", everything the CPU's flags offer
    (`-march=native`: AVX2, and for the int8 arithmetic AVX-512 VNNI or AVX-VNNI where it has them,
    and with AVX-512 whole 16-row tiles read in 512-bit registers); "ymm", that code in 256-bit
    registers only; "avx2", the AVX2 code without VNNI, compiled as for a machine without AVX-512 (16
    vector registers); "portable", the loops every machine runs. All give bitwise the same sums; the
    others are for tests and benchmarks to compare with."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"]
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
    # "avx2" as a machine without AVX-512 compiles it: 16 vector registers, no VNNI.
    flags += {"native": [], "ymm": ["-DSPECDRAFT_NO_ZMM"], "avx2": ["-DSPECDRAFT_NO_VNNI"] + ["-mno-avx512f"] * x86,
              "portable": ["-DSPECDRAFT_PORTABLE"]}[path]
    texts = [source.read_text() for source in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, version, _machine(), *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"blocks-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            sources = [str(source) for source in SOURCES]
            result = subprocess.run([compiler, *flags, *sources, "-o", str(built)], capture_output=True, text=True)
            if result.returncode != 0:
                names = " and ".join(source.name for source in SOURCES)
                raise RuntimeError(f"compiling {names} failed: {result.stderr.strip()[-2000:]}")
            os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target


CODES = {0: "portable", 2: "avx2", 3: "avx2+avx-vnni", 4: "avx2+avx512-vnni",
         5: "avx2+avx512-vnni+zmm"}  # `specdraft_blocks_version`


class Kernel:
    """The loaded kernel: `address` of `specdraft_project` (what numba calls), `quantize_address` of
    `specdraft_quantize`, `expand_address` of `specdraft_expand`, `attend_address` of
    `specdraft_attend`; `code`, what it runs (`CODES`: the portable loops, AVX2, AVX2 with a VNNI's
    int8 sums, with 512-bit tiles), and `avx2` whether that uses AVX2."""

    def __init__(self, path: Path) -> None:
        self._library = ctypes.CDLL(str(path))  # kept: unloading it would free the code
        self.address = ctypes.cast(self._library.specdraft_project, ctypes.c_void_p).value
        self.quantize_address = ctypes.cast(self._library.specdraft_quantize, ctypes.c_void_p).value
        self.expand_address = ctypes.cast(self._library.specdraft_expand, ctypes.c_void_p).value
        self.attend_address = ctypes.cast(self._library.specdraft_attend, ctypes.c_void_p).value
        self.job_queries = self._library.specdraft_attend_job_queries  # for a test to compare with `job_queries`
        self.job_queries.restype = ctypes.c_int64
        self.job_queries.argtypes = [ctypes.c_int64]
        self._library.specdraft_blocks_version.restype = ctypes.c_int64
        self.code = CODES[self._library.specdraft_blocks_version()]
        self.avx2 = self.code != "portable"
        self._kind = self._library.specdraft_kind
        self._kind.restype = ctypes.c_char_p
        self._kind.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
        self._tile = self._library.specdraft_tile
        self._tile.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        self._tile_values = self._library.specdraft_tile_values
        self._tile_values.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        self._offsets = {"projection": self._library.specdraft_projection_offset,
                         "attention": self._library.specdraft_attention_offset}
        for offset in self._offsets.values():
            offset.restype = ctypes.c_int64
            offset.argtypes = [ctypes.c_char_p]

    def calls(self, arithmetic: str = "float32") -> tuple[int, int]:
        """What `numba_layers.project` takes as its kernel: (`address`, `quantize_address` for the int8
        arithmetic, 0 for float32's)."""
        return self.address, self.quantize_address if arithmetic == "int8" else 0

    def tile(self, w: np.ndarray, kind: int) -> np.ndarray:
        """GGUF rows w [out, row bytes] of `kind` (out a multiple of 8) as the int8 arithmetic's tiles:
        the same bytes rearranged, 16 rows interleaved (blocks.cpp's int8 section says how)."""
        assert kind != F32 and w.shape[0] % TILE_ROWS == 0 and w.dtype == np.uint8
        w = np.ascontiguousarray(w)
        out = np.empty_like(w)
        self._tile(kind, w.ctypes.data, w.shape[0], w.shape[1], out.ctypes.data)
        return out

    def tile_values(self, tiles: np.ndarray, kind: int, width: int, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of tiles as float32 [len(ids), width]: the values their GGUF rows dequantise to."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        assert tiles.flags.c_contiguous and (ids.size == 0 or (ids.min() >= 0 and ids.max() < tiles.shape[0]))
        out = np.empty((ids.size, width), np.float32)
        self._tile_values(kind, tiles.ctypes.data, tiles.shape[0], tiles.shape[1], width, ids.ctypes.data, ids.size,
                          out.ctypes.data)
        return out

    def kind(self, kind: int) -> tuple[str, int, int] | None:
        """blocks.cpp's statement of a kind: its name and its unit's weights and bytes (`format.unit`),
        or None where it has no kind so numbered."""
        weights, size = ctypes.c_int64(), ctypes.c_int64()
        name = self._kind(kind, ctypes.byref(weights), ctypes.byref(size))
        return None if name is None else (name.decode(), weights.value, size.value)

    def offset(self, field: str | None, struct: str = "projection") -> int:
        """Where the C `Projection` (or `Attention`) holds `field` (None: its size in bytes); -1 where it
        has none."""
        return self._offsets[struct](None if field is None else field.encode())


@functools.cache
def kernel(path: str = "native") -> Kernel:
    """The compiled kernel for this machine (`build`'s `path`; compiled at first use; raises
    RuntimeError saying why it cannot be)."""
    if platform.system() != "Linux" and platform.system() != "Darwin":
        raise RuntimeError(f"the block kernel is built for Linux and macOS, not {platform.system()}")
    return Kernel(build(path))


def kernel_problem() -> str | None:
    """Why this machine has no compiled kernel (None: it has one, `kernel()`)."""
    try:
        kernel()
    except (RuntimeError, OSError) as exc:
        return str(exc)
    return None
