"""The builds of the compiled kernel (`specdraft.backend.native`) this machine runs, for tests that hold
every build to the same sums."""

from __future__ import annotations

from specdraft.backend import native


def builds() -> dict[str, native.Kernel]:
    """Every build of the kernel this machine runs: portable always, and where it has AVX2 the AVX2
    code, the native build and that in 256-bit registers only."""
    built = {"portable": native.kernel("portable")}
    if native.kernel().avx2:
        built.update(avx2=native.kernel("avx2"), ymm=native.kernel("ymm"), native=native.kernel())
    return built
