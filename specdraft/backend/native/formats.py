"""GGUF's block kinds as the kernel reads them, one entry each in `KINDS`: its number (as the kernel's
`csrc/formats.h` numbers it; `Kernel.kind` reads that back for a test to compare), its GGUF name, its
block's weights and bytes, where its float16 fields lie, and its dequantisation by torch (the float32
values the dense copy holds).

Blocks of 32 weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and IQ4_NL, whose nibbles index a table of 16 int8
weights), the K kinds' super-blocks of 256 (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS: sub-blocks
with their own scales), and float16 and bfloat16 weights read 32 at a time as a block (F16, BF16: `FLOATS`). Every value is gguf's float32, bitwise: the products are exact in float32
(float16 scales times integers of at most 8 bits), so each value is exact or, with an offset (Q4_1's
m, Q4_K's mins), the one rounding of its sum.

Adding a kind is one room: its entry here, its one entry in `csrc/formats.h` (`Traits<KIND>`: its
number, name, block, the facts its tiles follow and its scalar dequantisation; and its place in
`Kinds`, which `with_kind`, the kernel's one dispatch from a number to code, reads), and its two dot
products (`csrc/float32.cpp`'s `block_values`, the float32 arithmetic; the int8 one from its traits in
`csrc/int8.cpp`, or its own in `csrc/int8_k.cpp` for a kind of super-blocks). The CLI's help names
the kinds from this table. `tests/backend/test_block_kinds.py` then holds its
dequantisation and both dot products to gguf's own dequantisation on every build of the kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# kinds: float32 rows, and GGUF's block types (the kernel's numbers)
F32, Q4_1, Q8_0, Q5_0, Q4_K, Q6_K, Q4_0, Q5_1, IQ4_NL, Q5_K, IQ4_XS, Q3_K, Q2_K, F16, BF16 = range(15)


@dataclass(frozen=True)
class BlockKind:
    """A GGUF block type: `weights` weights in `bytes` bytes, float16 fields (scales, offsets) at the
    byte offsets `float16_at`, and `values`: blocks [..., bytes] uint8 -> float32 [..., weights]. The
    int8 arithmetic quantises a token's activations per block (`weights`: a K kind's per 256)."""

    number: int
    name: str
    weights: int
    bytes: int
    float16_at: tuple[int, ...]
    values: Callable[[torch.Tensor], torch.Tensor]

    def row_bytes(self, width: int) -> int:
        """The bytes of a row of `width` weights (whole blocks: refused otherwise)."""
        if width % self.weights:
            raise ValueError(f"a {self.name} row holds whole blocks of {self.weights} weights; {width} is not a "
                             f"multiple of {self.weights}")
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


def _q4_0_values(b: torch.Tensor) -> torch.Tensor:
    """Q4_0: float16 d, then 16 bytes as Q4_1's: w = d * (q - 8) (exact)."""
    return _half(b, 0) * (_nibbles(b[..., 2:]).float() - 8)


IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # llama.cpp's kvalues_iq4nl


def _iq4_nl_values(b: torch.Tensor) -> torch.Tensor:
    """IQ4_NL: float16 d, then 16 bytes as Q4_1's: w = d * IQ4_NL_VALUES[q] (exact)."""
    return _half(b, 0) * torch.tensor(IQ4_NL_VALUES, dtype=torch.float32)[_nibbles(b[..., 2:]).long()]


def _q8_0_values(b: torch.Tensor) -> torch.Tensor:
    """Q8_0: float16 d, then 32 int8 q: w = q * d (exact)."""
    q = b[..., 2:].contiguous().view(torch.int8).float()  # [..., 32]
    return q * _half(b, 0)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n] -> [..., 2n]: their low nibbles, then their high ones."""
    return torch.cat([packed & 15, packed >> 4], dim=-1)


def _five_bits(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    """The 5-bit integers [..., 32] of Q5_0 and Q5_1: a 32-bit qh at `qh_at`, then 16 bytes qs: element
    j's low 4 bits in qs (as Q4_1's), its 5th bit qh's bit j."""
    qh = b[..., qh_at : qh_at + 4].long()  # [..., 4] little-endian bytes of qh
    bits = (qh[..., torch.arange(32) // 8] >> (torch.arange(32) % 8)) & 1  # [..., 32]: element j's 5th bit
    return _nibbles(b[..., qh_at + 4 :]).long() | (bits << 4)


def _q5_0_values(b: torch.Tensor) -> torch.Tensor:
    """Q5_0: float16 d, then `_five_bits` q: w = d * (q - 16) (exact)."""
    return _half(b, 0) * (_five_bits(b, 2) - 16).float()


def _q5_1_values(b: torch.Tensor) -> torch.Tensor:
    """Q5_1: float16 d and m, then `_five_bits` q: w = d * q + m (the product exact, the sum one rounding)."""
    return _half(b, 0) * _five_bits(b, 4).float() + _half(b, 2)


def _q4_k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes of 6-bit scales and mins -> (sc, m) [..., 8] (llama.cpp's get_scale_min_k4): j < 4 in
    bytes j (sc) and j + 4 (m), low 6 bits; j >= 4 in byte j + 4's nibbles and the top 2 bits of bytes j - 4
    (sc) and j (m)."""
    low, mid, top = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([low & 63, (top & 15) | ((low >> 6) << 4)], dim=-1)
    m = torch.cat([mid & 63, (top >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, m


def _less_mins(d: torch.Tensor, scales: torch.Tensor, dmin: torch.Tensor, mins: torch.Tensor,
               q: torch.Tensor) -> torch.Tensor:
    """The kinds of scales and mins: w = (d * scale) * q - dmin * min for q [..., groups, weights] of
    `scales` and `mins` [..., groups] (the products exact, the difference one rounding), flat."""
    return ((d * scales.float()).unsqueeze(-1) * q.float() - (dmin * mins.float()).unsqueeze(-1)).flatten(-2)


def _pairs_of_bits(qs: torch.Tensor) -> torch.Tensor:
    """64 bytes [..., 64] of 2-bit integers (Q2_K's, Q3_K's low bits) as [..., h, j, l]: element 128h + 32j + l
    in byte 32h + l's bits 2j, 2j + 1."""
    return (qs.unflatten(-1, (2, 1, 32)).long() >> (2 * torch.arange(4).view(4, 1))) & 3


def _q4_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q4_K: float16 d, dmin, 12 bytes of scales (`_q4_k_scales`), 128 bytes qs: sub-block 2c's element e
    in byte 32c + e's low nibble, sub-block 2c + 1's in its high one: w = (d * sc) * q - dmin * m (the
    products exact, the difference one rounding)."""
    sc, m = _q4_k_scales(b[..., 4:16])
    qs = b[..., 16:].unflatten(-1, (4, 32))  # [..., 4, 32]
    q = torch.stack([qs & 15, qs >> 4], dim=-2).flatten(-3, -2)  # [..., 8, 32]
    return _less_mins(_half(b, 0), sc, _half(b, 2), m, q)


def _q5_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q5_K: Q4_K's d, dmin and scales, 32 bytes qh, then qs as Q4_K's: sub-block j's element e has its low
    4 bits as Q4_K's, its 5th qh byte e's bit j: w = (d * sc) * q - dmin * m (as Q4_K's)."""
    sc, m = _q4_k_scales(b[..., 4:16])
    qs = b[..., 48:].unflatten(-1, (4, 32))  # [..., 4, 32]
    low = torch.stack([qs & 15, qs >> 4], dim=-2).flatten(-3, -2)  # [..., 8, 32]
    high = (b[..., 16:48].unsqueeze(-2) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1  # [..., 8, 32]
    return _less_mins(_half(b, 0), sc, _half(b, 2), m, low | (high << 4))


def _iq4_xs_values(b: torch.Tensor) -> torch.Tensor:
    """IQ4_XS: float16 d, a 16-bit scales_h, 4 bytes scales_l, then each sub-block's 16 bytes as IQ4_NL's:
    sub-block j's 6-bit scale has its low 4 bits in scales_l byte j // 2's nibble j % 2, its top 2 in
    scales_h's bits 2j, 2j + 1: w = (d * (scale - 32)) * IQ4_NL_VALUES[q] (exact)."""
    high = (b[..., 2:4].contiguous().view(torch.int16).long() >> (2 * torch.arange(8))) & 3  # [..., 8]
    low = _nibbles(b[..., 4:8]).long()  # [..., 8]: the low nibbles (even j), then the high ones (odd j)
    low = torch.stack([low[..., :4], low[..., 4:]], dim=-1).flatten(-2)  # sub-block order
    d = _half(b, 0) * ((low | (high << 4)) - 32).float()  # [..., 8]
    q = torch.tensor(IQ4_NL_VALUES, dtype=torch.float32)[_nibbles(b[..., 8:].unflatten(-1, (8, 16))).long()]
    return (d.unsqueeze(-1) * q).flatten(-2)


def _q2_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q2_K: 16 bytes of scales (byte k: the 16 weights k's scale in its low nibble, its min in its high
    one), 64 bytes qs, float16 d and dmin. Element 128h + 32j + l: qs byte 32h + l's bits 2j, 2j + 1:
    w = (d * scale) * q - dmin * min (the products exact, the difference one rounding)."""
    scales = b[..., :16]
    q = _pairs_of_bits(b[..., 16:80]).flatten(-3).unflatten(-1, (16, 16))  # [..., 16, 16]
    return _less_mins(_half(b, 80), scales & 15, _half(b, 82), scales >> 4, q)


def _q3_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q3_K: 32 bytes hmask, 64 bytes qs, 12 bytes of 6-bit scales, float16 d. Element 128h + 32j + l: its
    low 2 bits qs byte 32h + l's bits 2j, 2j + 1, its 3rd hmask byte l's bit 4h + j; scale k (16 weights
    each): its low 4 bits byte k's low nibble (k < 8) or byte k - 8's high one, its top 2 bits byte
    8 + k % 4's bits 2 (k // 4), + 1: w = (d * (scale - 32)) * (q - 4) (exact)."""
    low = _nibbles(b[..., 96:104]).long()  # [..., 16]
    high = (b[..., 104:108].long().unsqueeze(-2) >> (2 * torch.arange(4).view(4, 1))) & 3  # [..., a, c]
    scales = (low | (high.flatten(-2) << 4)) - 32  # [..., 16]: scale 4a + c from byte 8 + c's bits 2a
    hm = b[..., :32].unsqueeze(-2).long() >> torch.arange(8).view(8, 1)  # [..., 4h + j, l]
    q = _pairs_of_bits(b[..., 32:96]).flatten(-3, -2) | ((hm & 1) << 2)  # [..., 8, 32]
    d = _half(b, 108) * scales.float()  # [..., 16]
    return (d.unsqueeze(-1) * (q - 4).float().unflatten(-1, (2, 16)).flatten(-3, -2)).flatten(-2)


def _q6_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, float16 d. Element 128h + 32k + i (k < 4, i < 32):
    its low 4 bits in ql byte 64h + 32(k % 2) + i (the low nibble for k < 2), its top 2 in qh byte 32h + i
    (bits 2k, 2k + 1); scale 16 weights each: w = (d * scale) * (q - 32) (exact)."""
    ql = b[..., :128].unflatten(-1, (2, 2, 32))  # [..., h, k % 2, i]
    low = torch.stack([ql & 15, ql >> 4], dim=-3).flatten(-3, -2)  # [..., h, k, i]: k = 2 * (k // 2) + k % 2
    qh = b[..., 128:192].unflatten(-1, (2, 1, 32))  # [..., h, 1, i]
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3  # [..., h, k, i]
    q = ((low | (high << 4)).long() - 32).float().flatten(-3).unflatten(-1, (16, 16))  # [..., 16, 16]
    d = _half(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float()  # [..., 16]
    return (d.unsqueeze(-1) * q).flatten(-2)


def _float_values(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """F16, BF16: 32 weights of `dtype` as they lie (64 bytes): w = the weight (exact in float32)."""
    return lambda b: b.contiguous().view(dtype).float()


FLOATS = {F16: torch.float16, BF16: torch.bfloat16}  # the kinds of float weights: no integers; the int8 arithmetic
# rounds its tokens to the kind (as llama.cpp's dot products for it do) and sums as the float32 one, over tiles
# of 8 rows whose 8-weight groups lie side by side (the kernel's `float_tile_at`)

KINDS = {
    Q4_0: BlockKind(Q4_0, "Q4_0", weights=32, bytes=18, float16_at=(0,), values=_q4_0_values),
    Q4_1: BlockKind(Q4_1, "Q4_1", weights=32, bytes=20, float16_at=(0, 2), values=_q4_1_values),
    Q8_0: BlockKind(Q8_0, "Q8_0", weights=32, bytes=34, float16_at=(0,), values=_q8_0_values),
    Q5_0: BlockKind(Q5_0, "Q5_0", weights=32, bytes=22, float16_at=(0,), values=_q5_0_values),
    Q5_1: BlockKind(Q5_1, "Q5_1", weights=32, bytes=24, float16_at=(0, 2), values=_q5_1_values),
    IQ4_NL: BlockKind(IQ4_NL, "IQ4_NL", weights=32, bytes=18, float16_at=(0,), values=_iq4_nl_values),
    Q4_K: BlockKind(Q4_K, "Q4_K", weights=256, bytes=144, float16_at=(0, 2), values=_q4_k_values),
    Q5_K: BlockKind(Q5_K, "Q5_K", weights=256, bytes=176, float16_at=(0, 2), values=_q5_k_values),
    IQ4_XS: BlockKind(IQ4_XS, "IQ4_XS", weights=256, bytes=136, float16_at=(0,), values=_iq4_xs_values),
    Q2_K: BlockKind(Q2_K, "Q2_K", weights=256, bytes=84, float16_at=(80, 82), values=_q2_k_values),
    Q3_K: BlockKind(Q3_K, "Q3_K", weights=256, bytes=110, float16_at=(108,), values=_q3_k_values),
    Q6_K: BlockKind(Q6_K, "Q6_K", weights=256, bytes=210, float16_at=(208,), values=_q6_k_values),
    **{number: BlockKind(number, name, weights=32, bytes=64, float16_at=(), values=_float_values(FLOATS[number]))
       for number, name in ((F16, "F16"), (BF16, "BF16"))},
}
NAMES = {F32: "F32", **{number: kind.name for number, kind in KINDS.items()}}  # GGUF's names for them
BLOCK = 32  # weights the kernel reads together (kBlock): a block, or a K kind's sub-block
BLOCK_BYTES = {number: kind.bytes for number, kind in KINDS.items()}


_BY_NAME = {kind.name: number for number, kind in KINDS.items()}


def kind_of(type_name: str, width: int) -> int | None:
    """The kind the kernel reads a GGUF tensor of type `type_name` (`F16`, `Q4_K`, ...) with rows of `width`
    weights as, or None where it does not (another type, or F16 and BF16 rows that are not whole 32s: GGUF's
    block types always hold whole blocks). Such tensors load as float32 copies."""
    number = _BY_NAME.get(type_name)
    return number if number is not None and width % KINDS[number].weights == 0 else None


def unit(kind: int) -> tuple[int, int]:
    """(weights, bytes) of a kind's unit: a float32 weight, or a block."""
    return (1, 4) if kind == F32 else (KINDS[kind].weights, KINDS[kind].bytes)


def dequantize(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """blocks [rows, row bytes] uint8 -> float32 [rows, width], the values the dense copy holds."""
    entry, rows = KINDS[kind], blocks.shape[0]
    assert blocks.shape[1] == entry.row_bytes(width), (blocks.shape, width)
    b = blocks.reshape(rows, width // entry.weights, entry.bytes)  # [rows, blocks, bytes]
    return entry.values(b).reshape(rows, width)
