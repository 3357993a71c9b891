"""Triton kernels whose arithmetic for a token does not depend on the pass that computes it.

A verify pass of k + 1 tokens must give each token the logits, keys and values a plain one-token
step gives it, bit for bit, or speculation changes greedy output (bf16 on CUDA rounds differently
when a library picks another kernel or split for another row count). So every reduction here has
a shape fixed by the weights and the token's own position, never by the pass:

- `linear`: rows are computed in tiles of `ROWS` (16, padding masked), the in-features in blocks of
  `BLOCK_K` from 0, and split into a fixed number of parts chosen from the weight's shape alone
  (partial sums in float32, added in order 0, 1, ... by a second kernel). A token's output is the
  same in a tile of 1 real row or of 16. Optional prologues: the RMS norm of the input rows
  (`norm`: the sum of squares in the same blocks) and SiLU(gate) * up of a joined gate/up input
  (`act`); epilogues: int8 weights' per-output scales, bias, the residual stream. Small weights are
  not split (`tiling`).
- `rope_write`: rotary embedding of q and k (transformers' `apply_rotary_pos_emb`, roundings and
  all) and the write of k and v into each token's cache slot at its position, one program a token.
- `attention`: one program per (token, kv head, chunk of keys at fixed offsets 0, chunk, ...; the
  chunk's size fixed per model, `chunk_for`): the token's query heads over its keys 0..position
  (read from the device, so the KV bucket does not matter), in blocks of `BLOCK_KV`; a second
  kernel merges the chunks in order.

Every kernel can launch programmatically dependent on the one before it (`Choice.pdl`, Hopper and
later): it may start while that one finishes, and waits for it (`_after_previous`) before it reads or
writes anything. How the kernels launch (tile, pipeline, PDL) is a `Choice`, fixed per model at load;
`SPECDRAFT_TRITON_CHOICE` (`Choice.parse`) overrides the default, which is how a GPU run compares them.

Under `TRITON_INTERPRET=1` the same kernels run on CPU (numpy), which is how CI tests them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl

ROWS = 16  # a linear's row tile (the smallest tensor-core tile), whatever the pass's row count
CHUNK = 256  # the fewest keys an attention program covers (`chunk_for`)
MAX_CHUNKS = 32  # chunks a row's longest context spans at most
BLOCK_KV = 64  # keys an attention program reads per iteration
TARGET_PROGRAMS = 512  # a linear splits its in-features until its grid has about this many programs
STAGES = 4  # a linear's pipeline stages (`Choice`: 512 programs of 4 stages was the fastest step on an H200)
MIN_SPLIT_WEIGHTS = 4 << 20  # a smaller weight is read fast enough unsplit (a split costs a launch)
# Triton's interpreter multiplies bf16 tiles wrongly: there every product runs on float32 tiles (the
# same values: a bf16 product is exact in float32), as float32 inputs do everywhere.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# And its `tl.dot` is numpy's BLAS, whose order of sums for a row can depend on the row's place in the
# tile (OpenBLAS's Haswell and Zen kernels: rows 6 and 8 of 16 sum otherwise than row 0), where a GPU's
# matrix instructions sum every row alike. Interpreted, `_dot` sums each output over K in order instead.
ROW_BY_ROW: tl.constexpr = tl.constexpr(INTERPRETED)


def _upcast(dtype: torch.dtype) -> bool:
    return INTERPRETED or dtype == torch.float32


@dataclass(frozen=True)
class Tiling:
    """How a linear reads its weight: out-features a program computes (`block_o`), in-features per
    iteration (`block_k`), the parts its in-features split into (`splits`, each whole blocks), and
    the launch's warps and pipeline stages. A function of the weight's shape alone (`tiling`), never
    of the rows, so that every pass sums a token's products the same way."""

    block_o: int = 64
    block_k: int = 64
    splits: int = 1
    warps: int = 4
    stages: int = STAGES

    def part(self, in_features: int) -> int:
        """In-features each part sums (a whole number of blocks)."""
        return triton.cdiv(triton.cdiv(in_features, self.block_k), self.splits) * self.block_k


def tiling(out_features: int, in_features: int, target: int = TARGET_PROGRAMS, block_o: int = 64,
           block_k: int = 64, warps: int = 4, stages: int = STAGES) -> Tiling:
    """The tiling of a weight of this shape: unsplit below `MIN_SPLIT_WEIGHTS`, else split in two
    until the grid has about `target` programs (more parts fill the device for narrow weights), each
    part at least 4 blocks. Which tiling is fastest is measured inside whole steps
    (`benchmarks/gpu/choices.py`): a linear timed alone (`benchmarks/gpu/kernels.py`) is no guide."""
    splits = 1
    if out_features * in_features >= MIN_SPLIT_WEIGHTS:
        tiles, blocks = triton.cdiv(out_features, block_o), triton.cdiv(in_features, block_k)
        while tiles * splits * 2 <= target and blocks // (splits * 2) >= 4:
            splits *= 2
    return Tiling(block_o, block_k, splits, warps, stages)


@dataclass(frozen=True)
class Choice:
    """How the kernels launch: the linear's tiles and pipeline (`tiling`'s parameters; any of them
    keeps a token's arithmetic the same in every pass) and programmatic dependent launch (`pdl`,
    used where the device has it: `pdl_available`)."""

    block_o: int = 64
    block_k: int = 64
    warps: int = 4
    stages: int = STAGES
    target: int = TARGET_PROGRAMS
    pdl: bool = True

    def tiling(self, out_features: int, in_features: int) -> Tiling:
        return tiling(out_features, in_features, self.target, self.block_o, self.block_k, self.warps, self.stages)

    @classmethod
    def parse(cls, text: str) -> "Choice":
        """"pdl=1,block_k=128,stages=4,target=256" (any fields, integers; pdl 0 or 1) -> a Choice."""
        names = {f.name for f in fields(cls)}
        changes = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            if name not in names or not value.strip().isdigit():
                raise ValueError(f"SPECDRAFT_TRITON_CHOICE: {item!r} is not one of {', '.join(sorted(names))} "
                                 "set to a whole number")
            changes[name] = bool(int(value)) if name == "pdl" else int(value)
        return replace(cls(), **changes)

    def describe(self) -> str:
        return ",".join(f"{f.name}={int(getattr(self, f.name))}" for f in fields(self))


CHOICE = Choice.parse(os.environ.get("SPECDRAFT_TRITON_CHOICE", ""))


def pdl_available(device: torch.device) -> bool:
    """Whether kernels can launch programmatically dependent here: compiled (not interpreted) on a
    CUDA device of compute capability 9 or later, with a Triton that has grid dependency control."""
    if INTERPRETED or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    return hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")


def _launch(pdl: bool) -> dict:
    """The launch's keyword arguments: programmatic dependent launch, or nothing."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def _after_previous(GDC: tl.constexpr):
    """With programmatic dependent launch: wait until the kernel before has finished and its writes
    are visible (nothing is read or written before this), then let the next kernel launch."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a [M, K] @ b [K, N], float32 sums; UPCAST: in IEEE float32 (float32 inputs; the interpreter).
    Interpreted (`ROW_BY_ROW`), each output is its K products summed in order, the same for every row."""
    if ROW_BY_ROW:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    elif UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _epilogue(acc, rows, cols, n_rows, n_out, s_ptr, b_ptr, res_ptr, stride_res, out_ptr, stride_out,
              SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """acc [ROWS, BLOCK_O] float32 -> times the int8 weights' scales, + bias, rounded to the output's
    dtype, + residual (rounded again, as `x + linear(h)` in that dtype is), stored."""
    ok = (rows < n_rows)[:, None] & (cols < n_out)[None, :]
    if SCALED:
        acc *= tl.load(s_ptr + cols, mask=cols < n_out, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < n_out, other=0.0).to(tl.float32)[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if HAS_RES:
        res = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=ok, other=0.0)
        y = (y.to(tl.float32) + res.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y, mask=ok)


# A row count of 1 (or one divisible by 16) must not compile another kernel than other counts do.
@triton.jit(do_not_specialize=["n_rows"])
def _linear_kernel(x_ptr, stride_x, w_ptr, stride_w, s_ptr, nw_ptr, b_ptr, res_ptr, stride_res, out_ptr, stride_out,
                   part_ptr, n_rows, n_out, n_in, eps,
                   NORM: tl.constexpr, ACT: tl.constexpr, SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_RES: tl.constexpr, SPLITS: tl.constexpr, K_PART: tl.constexpr, UPCAST: tl.constexpr,
                   GDC: tl.constexpr, ROWS_: tl.constexpr, BLOCK_O_: tl.constexpr, BLOCK_K_: tl.constexpr):
    pid_o, pid_r, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_r * ROWS_ + tl.arange(0, ROWS_)
    cols = pid_o * BLOCK_O_ + tl.arange(0, BLOCK_O_)
    row_ok, col_ok = rows < n_rows, cols < n_out
    dtype = x_ptr.dtype.element_ty  # the activations' (int8 weights are widened to it, exactly)
    _after_previous(GDC)
    if NORM:  # transformers' RMS norm: mean of squares in float32 over the whole row, then scale
        squares = tl.zeros([ROWS_], dtype=tl.float32)
        for k0 in range(0, n_in, BLOCK_K_):
            ks = k0 + tl.arange(0, BLOCK_K_)
            x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=row_ok[:, None] & (ks < n_in)[None, :],
                        other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
        inv = 1.0 / tl.sqrt(squares / n_in + eps)
    acc = tl.zeros([ROWS_, BLOCK_O_], dtype=tl.float32)
    start = pid_s * K_PART
    for k0 in range(start, start + K_PART, BLOCK_K_):
        ks = k0 + tl.arange(0, BLOCK_K_)
        k_ok = ks < n_in
        x_at = x_ptr + rows[:, None] * stride_x + ks[None, :]
        x_mask = row_ok[:, None] & k_ok[None, :]
        if ACT:  # x holds [gate | up], each n_in wide: SiLU(gate) * up in the activations' dtype
            gate = tl.load(x_at, mask=x_mask, other=0.0).to(tl.float32)
            up = tl.load(x_at + n_in, mask=x_mask, other=0.0)
            silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
            x = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)
        else:
            x = tl.load(x_at, mask=x_mask, other=0.0)
        if NORM:
            normed = (x.to(tl.float32) * inv[:, None]).to(dtype)
            nw = tl.load(nw_ptr + ks, mask=k_ok, other=0.0)
            x = (normed.to(tl.float32) * nw.to(tl.float32)[None, :]).to(dtype)
        w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if SCALED and not UPCAST:  # int8 -> the activations' dtype, exactly (UPCAST: to float32 in `_dot`)
            w = w.to(dtype)
        acc += _dot(x.to(dtype), tl.trans(w), UPCAST)
    if SPLITS == 1:
        _epilogue(acc, rows, cols, n_rows, n_out, s_ptr, b_ptr, res_ptr, stride_res, out_ptr, stride_out,
                  SCALED, HAS_BIAS, HAS_RES)
    else:
        ok = row_ok[:, None] & col_ok[None, :]
        tl.store(part_ptr + (pid_s * n_rows + rows[:, None]) * n_out + cols[None, :], acc, mask=ok)


@triton.jit(do_not_specialize=["n_rows"])
def _sum_parts_kernel(part_ptr, s_ptr, b_ptr, res_ptr, stride_res, out_ptr, stride_out, n_rows, n_out,
                      SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLITS: tl.constexpr,
                      GDC: tl.constexpr, ROWS_: tl.constexpr, BLOCK_O_: tl.constexpr):
    pid_o, pid_r = tl.program_id(0), tl.program_id(1)
    _after_previous(GDC)
    rows = pid_r * ROWS_ + tl.arange(0, ROWS_)
    cols = pid_o * BLOCK_O_ + tl.arange(0, BLOCK_O_)
    ok = (rows < n_rows)[:, None] & (cols < n_out)[None, :]
    acc = tl.zeros([ROWS_, BLOCK_O_], dtype=tl.float32)
    for s in tl.static_range(SPLITS):  # in order: the same sum for every pass
        acc += tl.load(part_ptr + (s * n_rows + rows[:, None]) * n_out + cols[None, :], mask=ok, other=0.0)
    _epilogue(acc, rows, cols, n_rows, n_out, s_ptr, b_ptr, res_ptr, stride_res, out_ptr, stride_out,
              SCALED, HAS_BIAS, HAS_RES)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           norm: tuple[torch.Tensor, float] | None = None, act: bool = False, residual: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, scales: torch.Tensor | None = None, tiled: Tiling | None = None,
           pdl: bool = False) -> torch.Tensor:
    """x [N, in] (with `act`: [N, 2 in], gate then up) times weight [out, in]: [N, out] in `out_dtype`
    (default x's). norm: (weight [in], eps), the input rows' RMS norm first; residual [N, out] added to
    the rounded product; scales [out]: int8 weights' per-output scales (the sums times them); tiled:
    the weight's tiling (default `tiling` of its shape); pdl: launch programmatically dependent."""
    n_rows = x.shape[0]
    n_out, n_in = weight.shape
    assert x.shape[1] == (2 * n_in if act else n_in), (x.shape, weight.shape, act)
    assert x.stride(1) == 1 and weight.stride(1) == 1
    assert (scales is not None) == (weight.dtype == torch.int8), "int8 weights, and only they, come with scales"
    out = torch.empty((n_rows, n_out), dtype=out_dtype or x.dtype, device=x.device)
    if n_rows == 0:
        return out
    t = tiled or tiling(n_out, n_in)
    splits = t.splits
    parts = (torch.empty((splits, n_rows, n_out), dtype=torch.float32, device=x.device) if splits > 1 else out)
    res = residual if residual is not None else out
    grid = (triton.cdiv(n_out, t.block_o), triton.cdiv(n_rows, ROWS), splits)
    nw, eps = norm if norm is not None else (x, 0.0)
    s, b = (scales if scales is not None else x), (bias if bias is not None else x)
    flags = dict(SCALED=scales is not None, HAS_BIAS=bias is not None, HAS_RES=residual is not None, GDC=pdl)
    _linear_kernel[grid](x, x.stride(0), weight, weight.stride(0), s, nw, b, res, res.stride(0), out, out.stride(0),
                         parts, n_rows, n_out, n_in, float(eps), NORM=norm is not None, ACT=act, SPLITS=splits,
                         K_PART=t.part(n_in), UPCAST=_upcast(x.dtype), ROWS_=ROWS, BLOCK_O_=t.block_o,
                         BLOCK_K_=t.block_k, num_warps=t.warps, num_stages=t.stages, **flags, **_launch(pdl))
    if splits > 1:
        _sum_parts_kernel[grid[:2]](parts, s, b, res, res.stride(0), out, out.stride(0), n_rows, n_out,
                                    SPLITS=splits, ROWS_=ROWS, BLOCK_O_=t.block_o, num_warps=4, **flags,
                                    **_launch(pdl))
    return out


@triton.jit
def _rotate_half(x_ptr, c1, c2, s1, s2, heads, d, HALF: tl.constexpr, ok):
    """transformers' q * cos + rotate_half(q) * sin for rows `heads` of x ([heads, 2 HALF] from x_ptr),
    each product and the sum rounded to x's dtype. c1, c2, s1, s2: cos and sin's halves [HALF], float32."""
    dtype = x_ptr.dtype.element_ty
    at = x_ptr + heads[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(at, mask=ok[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(at + HALF, mask=ok[:, None], other=0.0).to(tl.float32)
    first = ((x1 * c1[None, :]).to(dtype).to(tl.float32) - (x2 * s1[None, :]).to(dtype).to(tl.float32)).to(dtype)
    second = ((x2 * c2[None, :]).to(dtype).to(tl.float32) + (x1 * s2[None, :]).to(dtype).to(tl.float32)).to(dtype)
    return first, second


@triton.jit
def _rope_write_kernel(qkv_ptr, stride_qkv, cos_ptr, sin_ptr, stride_cs, slot_ptr, pos_ptr, q_ptr,
                       k_cache, v_cache, stride_cb, stride_ch, stride_cp,
                       HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       HEADS_PAD: tl.constexpr, KV_PAD: tl.constexpr, GDC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    _after_previous(GDC)
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HALF)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    pos = tl.load(pos_ptr + n).to(tl.int64)
    row = qkv_ptr + n * stride_qkv
    cs = cos_ptr + n * stride_cs
    sn = sin_ptr + n * stride_cs
    c1, c2 = tl.load(cs + d).to(tl.float32), tl.load(cs + HALF + d).to(tl.float32)
    s1, s2 = tl.load(sn + d).to(tl.float32), tl.load(sn + HALF + d).to(tl.float32)
    h = tl.arange(0, HEADS_PAD)
    ok = h < HEADS
    first, second = _rotate_half(row, c1, c2, s1, s2, h, d, HALF, ok)
    out = q_ptr + n * (HEADS * HEAD_DIM) + h[:, None] * HEAD_DIM + d[None, :]
    tl.store(out, first, mask=ok[:, None])
    tl.store(out + HALF, second, mask=ok[:, None])
    g = tl.arange(0, KV_PAD)
    kv_ok = g < KV_HEADS
    first, second = _rotate_half(row + HEADS * HEAD_DIM, c1, c2, s1, s2, g, d, HALF, kv_ok)
    at = slot * stride_cb + g[:, None] * stride_ch + pos * stride_cp + d[None, :]
    tl.store(k_cache + at, first.to(k_cache.dtype.element_ty), mask=kv_ok[:, None])
    tl.store(k_cache + at + HALF, second.to(k_cache.dtype.element_ty), mask=kv_ok[:, None])
    v = row + (HEADS + KV_HEADS) * HEAD_DIM + g[:, None] * HEAD_DIM + d[None, :]
    tl.store(v_cache + at, tl.load(v, mask=kv_ok[:, None], other=0.0).to(v_cache.dtype.element_ty), mask=kv_ok[:, None])
    tl.store(v_cache + at + HALF, tl.load(v + HALF, mask=kv_ok[:, None], other=0.0).to(v_cache.dtype.element_ty),
             mask=kv_ok[:, None])


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
               pdl: bool = False) -> torch.Tensor:
    """qkv [N, (heads + 2 kv_heads) head_dim] (a joined projection's output), cos/sin [N, head_dim]:
    write each token's rotated k and its v into keys/values [rows, kv_heads, capacity, head_dim] at
    (slots[n], positions[n]); return the rotated q [N, heads * head_dim]."""
    n = qkv.shape[0]
    q = torch.empty((n, heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    assert keys.stride() == values.stride() and keys.stride(3) == 1 and cos.stride() == sin.stride()
    if n:
        _rope_write_kernel[(n,)](qkv, qkv.stride(0), cos, sin, cos.stride(0), slots, positions, q, keys, values,
                                 keys.stride(0), keys.stride(1), keys.stride(2),
                                 HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
                                 HEADS_PAD=triton.next_power_of_2(heads), KV_PAD=triton.next_power_of_2(kv_heads),
                                 GDC=pdl, num_warps=4, **_launch(pdl))
    return q


@triton.jit
def _attention_chunk_kernel(q_ptr, k_cache, v_cache, stride_cb, stride_ch, stride_cp, slot_ptr, pos_ptr,
                            m_ptr, l_ptr, acc_ptr, n_chunks, scale,
                            HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                            HEAD_DIM: tl.constexpr, CHUNK_: tl.constexpr, BLOCK_KV_: tl.constexpr, UPCAST: tl.constexpr,
                            GDC: tl.constexpr):
    n, h, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    _after_previous(GDC)
    pos = tl.load(pos_ptr + n)
    start = c * CHUNK_
    if start <= pos:
        slot = tl.load(slot_ptr + n).to(tl.int64)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        heads = h * GROUP + g  # the query heads that read kv head h
        dtype = k_cache.dtype.element_ty
        q = tl.load(q_ptr + n.to(tl.int64) * (HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :],
                    mask=(g < GROUP)[:, None], other=0.0).to(dtype)
        base = slot * stride_cb + h * stride_ch
        m = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        end = tl.minimum(start + CHUNK_, pos + 1)
        for j0 in range(start, end, BLOCK_KV_):
            js = j0 + tl.arange(0, BLOCK_KV_)
            ok = js < end
            at = base + js.to(tl.int64)[:, None] * stride_cp + d[None, :]
            k = tl.load(k_cache + at, mask=ok[:, None], other=0.0)
            v = tl.load(v_cache + at, mask=ok[:, None], other=0.0)
            s = _dot(q, tl.trans(k), UPCAST)
            s = tl.where(ok[None, :], s * scale, float("-inf"))  # [GROUP_PAD, BLOCK_KV]
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _dot(p.to(dtype), v, UPCAST)
            m = m_new
        out = (n.to(tl.int64) * HEADS + heads) * n_chunks + c  # [GROUP_PAD]
        keep = g < GROUP
        tl.store(m_ptr + out, m, mask=keep)
        tl.store(l_ptr + out, l, mask=keep)
        tl.store(acc_ptr + out[:, None] * HEAD_DIM + d[None, :], acc, mask=keep[:, None])


@triton.jit
def _attention_merge_kernel(m_ptr, l_ptr, acc_ptr, pos_ptr, out_ptr, n_chunks,
                            HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, CHUNK_: tl.constexpr, GDC: tl.constexpr):
    n, h = tl.program_id(0), tl.program_id(1)
    _after_previous(GDC)
    used = tl.load(pos_ptr + n) // CHUNK_ + 1
    d = tl.arange(0, HEAD_DIM)
    base = (n.to(tl.int64) * HEADS + h) * n_chunks
    top = tl.load(m_ptr + base)
    for c in range(1, used):
        top = tl.maximum(top, tl.load(m_ptr + base + c))
    total = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for c in range(0, used):  # in order: the same sum for every pass
        weight = tl.exp(tl.load(m_ptr + base + c) - top)
        total += weight * tl.load(l_ptr + base + c)
        acc += weight * tl.load(acc_ptr + (base + c) * HEAD_DIM + d)
    out = out_ptr + n.to(tl.int64) * (HEADS * HEAD_DIM) + h * HEAD_DIM + d
    tl.store(out, (acc / total).to(out_ptr.dtype.element_ty))


def chunk_for(max_context: int) -> int:
    """Keys an attention program covers for a model of this context length: a power of two, at least
    `CHUNK`, so that the longest context spans at most `MAX_CHUNKS` chunks (fixed per model, so every
    pass splits a token's keys at the same offsets)."""
    return max(CHUNK, triton.next_power_of_2(triton.cdiv(max_context, MAX_CHUNKS)))


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
              heads: int, kv_heads: int, head_dim: int, chunk: int = CHUNK, pdl: bool = False) -> torch.Tensor:
    """Causal attention of each token's q [N, heads * head_dim] over its row's keys and values
    [rows, kv_heads, capacity, head_dim] at positions 0..positions[n] of slot slots[n] (written
    already), the keys split in chunks of `chunk` at offsets 0, chunk, 2 chunk, ...: [N, heads *
    head_dim] in q's dtype."""
    n = q.shape[0]
    out = torch.empty_like(q)
    if not n:
        return out
    n_chunks = triton.cdiv(keys.shape[2], chunk)
    group = heads // kv_heads
    m = torch.empty((n, heads, n_chunks), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((n, heads, n_chunks, head_dim), dtype=torch.float32, device=q.device)
    _attention_chunk_kernel[(n, kv_heads, n_chunks)](
        q, keys, values, keys.stride(0), keys.stride(1), keys.stride(2), slots, positions, m, l, acc, n_chunks,
        head_dim ** -0.5, HEADS=heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, CHUNK_=chunk, BLOCK_KV_=BLOCK_KV, UPCAST=_upcast(keys.dtype), GDC=pdl, num_warps=4,
        **_launch(pdl))
    _attention_merge_kernel[(n, heads)](m, l, acc, positions, out, n_chunks, HEADS=heads, HEAD_DIM=head_dim,
                                        CHUNK_=chunk, GDC=pdl, num_warps=1, **_launch(pdl))
    return out
