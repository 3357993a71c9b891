"""`benchmarks.cpu.kernel_ab`: another revision's kernel sources, and the bitwise comparison that
holds two kernels to the same sums."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cpu.kernel_ab import bitwise, report, revision_source, shared_kinds
from specdraft.backend import native

pytestmark = pytest.mark.skipif(native.kernel_problem() is not None, reason="no block kernel here")


class _Tampered:
    """A kernel whose int8 tiles have one byte changed: the comparison must see it."""

    def __init__(self, kernel: native.Kernel) -> None:
        self.kernel = kernel

    def tile(self, blocks: np.ndarray, kind: int) -> np.ndarray:
        tiles = self.kernel.tile(blocks, kind).copy()
        tiles.reshape(-1)[tiles.size // 2] ^= 1
        return tiles

    def calls(self, arithmetic: str):
        return self.kernel.calls(arithmetic)


def test_a_revisions_kernel_sources_are_written_out(tmp_path):
    source = revision_source("HEAD", tmp_path)
    assert (source / "formats.h").is_file() and list(source.glob("*.cpp"))


def test_a_kernel_against_itself_differs_nowhere_and_a_changed_one_is_named():
    kernel = native.kernel()
    assert bitwise(kernel, kernel) == []
    differ = bitwise(kernel, _Tampered(kernel))
    assert "Q4_1 tiles" in differ and "Q4_1 int8 1 tokens" in differ
    assert not any("float32" in item for item in differ)  # the float32 arithmetic reads the blocks, not the tiles


class _Older:
    """A kernel from before a kind was added: it states no Q5_1."""

    def __init__(self, kernel: native.Kernel) -> None:
        self.kernel = kernel

    def kind(self, number: int):
        return None if number == native.Q5_1 else self.kernel.kind(number)


def test_only_the_kinds_both_kernels_state_are_compared():
    kernel = native.kernel()
    assert [kind.name for kind in shared_kinds(kernel)] == [kind.name for kind in native.KINDS.values()]
    assert "Q5_1" not in [kind.name for kind in shared_kinds(_Older(kernel))]


def test_the_report_names_each_paths_result():
    text = report("abc123", "avx2", 3, {"native": [], "avx2": ["Q4_1 tiles"]},
                  [{"kind": "Q4_1", "shape": "8x32", "arithmetic": "int8", "tokens": 1, "old_ms": 1.0, "new_ms": 0.5,
                    "ratio": 0.5}], ["Q5_1"])
    assert "Kinds new in the working tree (nothing to compare them with): Q5_1." in text
    assert "| native | none: tiles and both arithmetics equal at every width |" in text
    assert "| avx2 | Q4_1 tiles |" in text and "| Q4_1 | 8x32 | int8 | 1 | 1.000 | 0.500 | 0.50 |" in text
