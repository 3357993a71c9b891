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
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from specdraft.params import cache_dir

SOURCE = Path(__file__).parent.parent / "blocks.cpp"  # beside the package: where the package data puts it

Projection = namedtuple("Projection", ["kind", "w", "row_bytes", "width", "x", "n", "xs", "y", "ys", "bias",
                                       "residual", "rs"])
Projection.__doc__ = """What a call of the kernel computes, y[t, r] = (w[r] . x[t] + bias[r]) (+ residual[t, r]):
blocks.cpp's `Projection`, the same fields in the same order (`Kernel.offset` reads where it holds
each), every one an integer (pointers as integers, 0 for none). kind: F32, Q4_1 or Q8_0; w [out,
row_bytes] float32 rows or blocks; width: weights in a row; x [n, xs]; y [n, ys]; bias [out];
residual [n, rs] or 0."""


@intrinsic
def call(typingctx, address, projection, start, end):  # pragma: no cover - compiled
    """Call the C function at `address` (`specdraft_project` or `specdraft_expand`) for rows [start,
    end) of `projection`, a `Projection` it reads by address as blocks.cpp's struct. A call by
    address, so a cached caller holds no process's addresses."""
    if not (isinstance(projection, types.BaseNamedTuple) and projection.instance_class is Projection):
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


_ROWS = 16  # rows a work item of `expand` takes


@njit(parallel=True, cache=True)
def expand(w, kind, y, kernel):  # pragma: no cover - compiled
    """y [out, width] = the float32 values of w [out, row bytes] (blocks of `kind`), by the compiled
    kernel's `specdraft_expand` at address `kernel`, blocks of rows among the threads."""
    out = w.shape[0]
    for block in prange((out + _ROWS - 1) // _ROWS):  # the Projection made here: a parallel loop takes none in
        projection = Projection(kind=kind, w=w.ctypes.data, row_bytes=w.shape[1], width=y.shape[1], x=0, n=0, xs=0,
                                y=y.ctypes.data, ys=y.shape[1], bias=0, residual=0, rs=0)
        call(kernel, projection, block * _ROWS, min(out, block * _ROWS + _ROWS))


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


def build(portable: bool = False) -> Path:
    """Compile blocks.cpp for this machine (`portable`: without the AVX2 intrinsics, the loops every
    machine runs), once per source, compiler and CPU; return the shared library's path."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"]
    if portable:
        flags.append("-DSPECDRAFT_PORTABLE")
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _machine(), *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"blocks-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([compiler, *flags, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling {SOURCE.name} failed: {result.stderr.strip()[-2000:]}")
            os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target


class Kernel:
    """The loaded kernel: `address` of `specdraft_project` (what numba calls), `expand_address` of
    `specdraft_expand`, `avx2` whether it runs the AVX2 intrinsics (else the portable loops)."""

    def __init__(self, path: Path) -> None:
        self._library = ctypes.CDLL(str(path))  # kept: unloading it would free the code
        self.address = ctypes.cast(self._library.specdraft_project, ctypes.c_void_p).value
        self.expand_address = ctypes.cast(self._library.specdraft_expand, ctypes.c_void_p).value
        self._library.specdraft_blocks_version.restype = ctypes.c_int64
        self.avx2 = self._library.specdraft_blocks_version() == 2
        self._kind = self._library.specdraft_kind
        self._kind.restype = ctypes.c_char_p
        self._kind.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
        self._offset = self._library.specdraft_projection_offset
        self._offset.restype = ctypes.c_int64
        self._offset.argtypes = [ctypes.c_char_p]

    def kind(self, kind: int) -> tuple[str, int, int] | None:
        """blocks.cpp's statement of a kind: its name and its unit's weights and bytes (`format.unit`),
        or None where it has no kind so numbered."""
        weights, size = ctypes.c_int64(), ctypes.c_int64()
        name = self._kind(kind, ctypes.byref(weights), ctypes.byref(size))
        return None if name is None else (name.decode(), weights.value, size.value)

    def offset(self, field: str | None) -> int:
        """Where blocks.cpp's `Projection` holds `field` (None: its size in bytes); -1 where it has none."""
        return self._offset(None if field is None else field.encode())


@functools.cache
def kernel(portable: bool = False) -> Kernel:
    """The compiled kernel for this machine (compiled at first use; raises RuntimeError saying why
    it cannot be)."""
    if platform.system() != "Linux" and platform.system() != "Darwin":
        raise RuntimeError(f"the block kernel is built for Linux and macOS, not {platform.system()}")
    return Kernel(build(portable))


def kernel_problem() -> str | None:
    """Why this machine has no compiled kernel (None: it has one, `kernel()`)."""
    try:
        kernel()
    except (RuntimeError, OSError) as exc:
        return str(exc)
    return None
