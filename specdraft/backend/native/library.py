"""The loaded kernel (`Kernel`: its functions' addresses for numba to call, and the calls a test or a
model makes once: tiling, the tiles' values, the kernel's own statement of its formats and structs),
built for this machine at first use (`kernel()`, or `kernel_problem()`: why there is none)."""

from __future__ import annotations

import ctypes
import functools
import platform
from pathlib import Path

import numpy as np

from specdraft.backend.native.build import build, chosen_path
from specdraft.backend.native.formats import F32

TILE_ROWS = 8  # rows a half tile of the int8 arithmetic interleaves (csrc/int8.cpp's kTileRows)

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

    def tile(self, w: np.ndarray, kind: int, out: np.ndarray | None = None) -> np.ndarray:
        """GGUF rows w [out, row bytes] of `kind` (out a multiple of 8) as the int8 arithmetic's tiles:
        the same bytes rearranged, 16 rows interleaved (csrc/int8.cpp says how; F16's and BF16's 8 rows,
        csrc/projection.h's `float_tile_at`); written into `out`
        where given (w's shape, contiguous, not w), else into a new array."""
        assert kind != F32 and w.shape[0] % TILE_ROWS == 0 and w.dtype == np.uint8
        w = np.ascontiguousarray(w)
        out = np.empty_like(w) if out is None else out
        assert out.shape == w.shape and out.dtype == np.uint8 and out.flags.c_contiguous
        assert not np.shares_memory(out, w), "tiles are written beside the rows, not over them"
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
        """The kernel's statement of a kind (csrc/formats.h): its name and its unit's weights and bytes (`format.unit`),
        or None where it has no kind so numbered."""
        weights, size = ctypes.c_int64(), ctypes.c_int64()
        name = self._kind(kind, ctypes.byref(weights), ctypes.byref(size))
        return None if name is None else (name.decode(), weights.value, size.value)

    def offset(self, field: str | None, struct: str = "projection") -> int:
        """Where the C `Projection` (or `Attention`) holds `field` (None: its size in bytes); -1 where it
        has none."""
        return self._offsets[struct](None if field is None else field.encode())


def kernel(path: str | None = None) -> Kernel:
    """The compiled kernel for this machine (`build`'s `path`, by default the process's
    `chosen_path()`; compiled at first use; raises RuntimeError saying why it cannot be)."""
    return _kernel(path or chosen_path())


@functools.cache
def _kernel(path: str) -> Kernel:
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
