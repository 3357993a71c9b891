"""Memory for weights a step streams: anonymous, 2 MB aligned, asked to be backed by 2 MB pages
(`huge_page_buffer`). Streaming weights from 4 KB pages costs a page walk every 4 KB, which 2 MB
pages spare (`benchmarks/results/cpu/cpu_profile.md`)."""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of `nbytes` in anonymous memory, 2 MB aligned, that the kernel is asked
    to back with 2 MB pages (`MADV_HUGEPAGE`, before any page is touched; where it does not, plain
    pages)."""
    area = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            area.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # transparent huge pages not configured: plain pages
            pass
    raw = np.frombuffer(area, np.uint8)  # keeps `area` alive as long as a view of it lives
    start = (-raw.ctypes.data) % HUGE_PAGE
    return raw[start : start + nbytes]
