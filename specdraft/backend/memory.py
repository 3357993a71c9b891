"""Handing memory freed by a long prompt back to the system (`return_freed`).

A long prompt's prefill allocates and frees tens of megabytes a pass (attention's per-span sums, a
grown KV cache's old buffers). glibc keeps freed blocks of that size in its heap (its mmap threshold
rises as large blocks are freed), so a server's resident set stays at its high-water mark after the
prompt is gone; `malloc_trim` returns the heap's free pages. Elsewhere (musl, macOS) it is a no-op.
"""

from __future__ import annotations

import ctypes

try:
    _TRIM = ctypes.CDLL(None).malloc_trim
    _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
except (AttributeError, OSError):  # not glibc
    _TRIM = None


def return_freed() -> None:
    """Return the C heap's free pages to the system (a few milliseconds over a heap of a gigabyte)."""
    if _TRIM is not None:
        _TRIM(0)
