"""GGUF's block kinds as the kernel reads them, one entry each in `KINDS`: its number (as the kernel's
`csrc/formats.h` numbers it; `Kernel.kind` reads that back for a test to compare), its GGUF name, its
block's weights and bytes, where its float16 fields lie, and its dequantisation by torch (the float32
values the dense copy holds).

Adding a kind is one room: its entry here, the same entry in `csrc/formats.h` (its number, bytes and
`expand_row` branch), and its two dot products (`csrc/float32.cpp`'s `block_values`, the float32
arithmetic; `csrc/int8.cpp`'s tiles, the int8 one). `tests/backend/test_block_kinds.py` then holds its
dequantisation and both dot products to gguf's own dequantisation on every build of the kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

F32, Q4_1, Q8_0 = 0, 1, 2  # kinds: float32 rows, and GGUF's block types (the kernel's numbers)


@dataclass(frozen=True)
class BlockKind:
    """A GGUF block type: `weights` weights in `bytes` bytes, float16 fields (scales, offsets) at the
    byte offsets `float16_at`, and `values`: blocks [..., bytes] uint8 -> float32 [..., weights]."""

    number: int
    name: str
    weights: int
    bytes: int
    float16_at: tuple[int, ...]
    values: Callable[[torch.Tensor], torch.Tensor]

    def row_bytes(self, width: int) -> int:
        """The bytes of a row of `width` weights."""
        return width // self.weights * self.bytes


def _half(b: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte `at` of each block, as float32 [..., 1]."""
    return b[..., at : at + 2].contiguous().view(torch.float16).float()


def _q4_1_values(b: torch.Tensor) -> torch.Tensor:
    """Q4_1: float16 d and m, then 16 bytes, element j in byte j's low nibble and j + 16 in its high
    one: w = d * q + m (the product exact, the sum one rounding)."""
    packed = b[..., 4:]  # [..., 16]
    q = torch.cat([packed & 15, packed >> 4], dim=-1).float()  # [..., 32]
    return _half(b, 0) * q + _half(b, 2)


def _q8_0_values(b: torch.Tensor) -> torch.Tensor:
    """Q8_0: float16 d, then 32 int8 q: w = q * d (exact)."""
    q = b[..., 2:].contiguous().view(torch.int8).float()  # [..., 32]
    return q * _half(b, 0)


KINDS = {
    Q4_1: BlockKind(Q4_1, "Q4_1", weights=32, bytes=20, float16_at=(0, 2), values=_q4_1_values),
    Q8_0: BlockKind(Q8_0, "Q8_0", weights=32, bytes=34, float16_at=(0,), values=_q8_0_values),
}
NAMES = {F32: "F32", **{number: kind.name for number, kind in KINDS.items()}}  # GGUF's names for them
BLOCK = 32  # activations the int8 arithmetic quantises together (the kernel's kBlock), a block's weights
BLOCK_BYTES = {number: kind.bytes for number, kind in KINDS.items()}


def unit(kind: int) -> tuple[int, int]:
    """(weights, bytes) of a kind's unit: a float32 weight, or a block."""
    return (1, 4) if kind == F32 else (KINDS[kind].weights, KINDS[kind].bytes)


def dequantize(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """blocks [rows, row bytes] uint8 -> float32 [rows, width], the values the dense copy holds."""
    entry, rows = KINDS[kind], blocks.shape[0]
    b = blocks.reshape(rows, width // entry.weights, entry.bytes)  # [rows, blocks, bytes]
    return entry.values(b).reshape(rows, width)
