"""GGUF blocks as the kernel reads them: the kinds (numbered as `blocks.cpp` numbers them, which
`Kernel.kind` reads back for a test to compare), their sizes, and their float32 values by torch."""

from __future__ import annotations

import torch

F32, Q4_1, Q8_0 = 0, 1, 2  # kinds: float32 rows, and GGUF's two block types
NAMES = {F32: "F32", Q4_1: "Q4_1", Q8_0: "Q8_0"}  # GGUF's names for them
BLOCK = 32  # weights per block
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # float16 d (and m) and the packed q


def unit(kind: int) -> tuple[int, int]:
    """(weights, bytes) of a kind's unit: a float32 weight, or a block."""
    return (1, 4) if kind == F32 else (BLOCK, BLOCK_BYTES[kind])


def dequantize(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """blocks [rows, row bytes] uint8 -> float32 [rows, width], the values the dense copy holds."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, width // BLOCK, BLOCK_BYTES[kind])  # [rows, blocks, bytes]
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # [rows, blocks, 1]
    if kind == Q8_0:
        q = b[..., 2:].contiguous().view(torch.int8).float()  # [rows, blocks, 32]
        return (q * d).reshape(rows, width)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    packed = b[..., 4:]  # [rows, blocks, 16]: element j in the low nibble, j + 16 in the high one
    q = torch.cat([packed & 15, packed >> 4], dim=-1).float()  # [rows, blocks, 32]
    return (d * q + m).reshape(rows, width)
