"""Every block kind the kernel reads (`native.KINDS`), held to gguf's own dequantisation
(`gguf.quants.dequantize`) on synthetic random blocks, on every build of the kernel this machine runs:
the kernel states the kind as Python does; its dequantisation (by torch, by the kernel, and read back
from the int8 arithmetic's tiles) is gguf's, bitwise; its float32 dot products are those of gguf's
values as float32 rows, bitwise, and within rounding of a float64 product; its int8 dot products are
within the activations' quantisation error (per block; a K kind's per super-block of 256) of the
float64 product with gguf's values, and bitwise the same on every build and for a token in any pass (a kind
of float weights': float32's on its tokens rounded to the kind). A kind added to `KINDS` is checked here as
it is added."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cpu.kind_kernel import synthetic_blocks
from specdraft.backend import native
from specdraft.backend.native.calls import expand
from specdraft.backend.numba_layers import NO_RESIDUAL, project
from tests.helpers.kernels import builds

pytestmark = pytest.mark.compiles

gguf = pytest.importorskip("gguf")

KINDS = list(native.KINDS.values())
ROWS, WIDTH = 40, 512  # whole tiles of 16 rows and a last one of 8; rows of whole 256-weight superblocks
COUNTS = [*range(1, 18), 33]  # every pass width to 17, and one past a pass's 32-token chunk (int8_k_pass.cpp's kPassTokens)


def gguf_values(kind: native.BlockKind, w: np.ndarray) -> np.ndarray:
    """gguf's dequantisation of blocks w [rows, row bytes]: float32 [rows, width]."""
    return gguf.quants.dequantize(w, getattr(gguf.GGMLQuantizationType, kind.name))


def projected(kernel: tuple, w: np.ndarray, kind: int, x: np.ndarray) -> np.ndarray:
    y = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    project((w, np.zeros(0, np.float32), np.zeros(w.shape[0], np.float32), kind), x, y, NO_RESIDUAL, kernel)
    return y


@pytest.mark.parametrize("kind", KINDS, ids=[kind.name for kind in KINDS])
def test_every_kind_is_stated_and_dequantised_as_gguf_does_on_every_build(kind):
    import torch

    w = synthetic_blocks(np.random.default_rng(kind.number), kind, ROWS, WIDTH)
    want = gguf_values(kind, w)
    assert w.shape[1] == kind.row_bytes(WIDTH) and np.isfinite(want).all()
    assert np.array_equal(native.dequantize(torch.from_numpy(w), kind.number, WIDTH).numpy(), want)
    for name, kernel in builds().items():
        assert kernel.kind(kind.number) == (kind.name, kind.weights, kind.bytes), name
        expanded = np.full((ROWS, WIDTH), np.nan, np.float32)
        expand(w, kind.number, expanded, kernel.expand_address)
        assert np.array_equal(expanded, want), name
        tiled = kernel.tile_values(kernel.tile(w, kind.number), kind.number, WIDTH, np.arange(ROWS))
        assert np.array_equal(tiled, want), f"{name}: from the tiles"


@pytest.mark.parametrize("kind", KINDS, ids=[kind.name for kind in KINDS])
def test_every_kinds_float32_dot_products_are_those_of_ggufs_values_on_every_build(kind):
    rng = np.random.default_rng(10 + kind.number)
    w = synthetic_blocks(rng, kind, ROWS, WIDTH)
    values = gguf_values(kind, w)
    rows = np.ascontiguousarray(values).view(np.uint8)  # gguf's values as the kernel's float32 rows
    for name, kernel in builds().items():
        for n in COUNTS:
            x = rng.standard_normal((n, WIDTH)).astype(np.float32)
            got = projected(kernel.calls(), w, kind.number, x)
            assert np.array_equal(got, projected(kernel.calls(), rows, native.F32, x)), f"{name}, {n} tokens"
            odd = projected(kernel.calls(), w[:-1], kind.number, x)  # 39 rows: a last one without a partner
            assert np.array_equal(odd, got[:, :-1]), f"{name}, {n} tokens, 39 rows"
            exact = x.astype(np.float64) @ values.T.astype(np.float64)
            np.testing.assert_allclose(got, exact, rtol=0, atol=1e-5 * np.sqrt(WIDTH) * np.abs(values).max() * 10)


@pytest.mark.parametrize("kind", KINDS, ids=[kind.name for kind in KINDS])
def test_every_kinds_int8_dot_products_hold_ggufs_values_on_every_build(kind):
    rng = np.random.default_rng(20 + kind.number)
    w = synthetic_blocks(rng, kind, ROWS, WIDTH)
    values = gguf_values(kind, w).astype(np.float64)
    built = builds()
    tiles = built["portable"].tile(w, kind.number)
    for n in COUNTS:
        x = rng.standard_normal((n, WIDTH)).astype(np.float32)
        want = projected(built["portable"].calls("int8"), tiles, kind.number, x)
        for name, kernel in built.items():
            assert np.array_equal(projected(kernel.calls("int8"), tiles, kind.number, x), want), f"{name}, {n} tokens"
            alone = projected(kernel.calls("int8"), tiles, kind.number, x[-1:].copy())
            assert np.array_equal(alone[0], want[-1]), f"{name}: the last of {n} tokens alone"
        exact = x.astype(np.float64) @ values.T
        span = kind.weights  # the activations quantised together: a block's (a K kind's super-block's)
        step = np.abs(x).reshape(n, -1, span).max(axis=2).repeat(span, axis=1) / 127  # x's quantum
        bound = 0.5 * step @ np.abs(values.T) + 1e-5 * (np.abs(x) @ np.abs(values.T))
        assert np.all(np.abs(want - exact) <= bound), f"{n} tokens: beyond the quantisation's error"


INTEGER_KINDS = [kind for kind in KINDS if kind.number not in native.FLOATS]


@pytest.mark.parametrize("kind", INTEGER_KINDS, ids=[kind.name for kind in INTEGER_KINDS])
def test_every_kinds_int8_sums_at_the_extremes_are_bitwise_the_same_on_every_build(kind):
    """Every weight at its largest code (bytes 0xff) or scales at their most negative (0x80), against
    activations all at +-127: sums at their largest, where a build that sums in int16 (AVX2 without
    VNNI) would wrap if it were not exact."""
    built = builds()
    x = np.repeat(np.array([[1.0], [-1.0], [1.0], [-1.0], [1.0], [-1.0]], np.float32), WIDTH, axis=1)
    x[2:4, 1::2] *= -1  # alternating signs: each pair's products of opposite signs
    for byte in (0xFF, 0x80):
        w = np.full((ROWS, WIDTH // kind.weights, kind.bytes), byte, np.uint8)
        for at in kind.float16_at:
            w[..., at : at + 2] = np.full(w.shape[:2], 0.01, np.float16)[..., None].view(np.uint8)
        w = w.reshape(ROWS, -1)
        tiles = built["portable"].tile(w, kind.number)
        for n in (1, 4, 6):  # a decode token, the most tokens unpacked as they are read, a pass unpacked once
            want = projected(built["portable"].calls("int8"), tiles, kind.number, x[:n])
            assert np.isfinite(want).all()
            for name, kernel in built.items():
                assert np.array_equal(projected(kernel.calls("int8"), tiles, kind.number, x[:n]), want), f"{name}, {byte:#x}"


def rounding_probes(dtype) -> np.ndarray:
    """Activations that meet every case of rounding float32 to `dtype`: ties to even both ways, values just
    past a tie, the largest finite values and past them (infinity), subnormals of the kind and zeros."""
    import torch

    info = torch.finfo(dtype)
    ulp_at_one = 2.0 ** -(info.bits - 1 - (8 if dtype == torch.bfloat16 else 5))  # the kind's ulp at 1
    ties = np.array([1 + ulp_at_one / 2, 1 + 1.5 * ulp_at_one, -(1 + ulp_at_one / 2)], np.float32)
    near = np.nextafter(ties, np.float32(np.inf))
    edges = np.array([info.max, -info.max, info.max * (1 + ulp_at_one / 4), info.smallest_normal,
                      info.smallest_normal / 3, info.smallest_normal / 1000, 0.0, -0.0], np.float32)
    return np.concatenate([ties, near, edges])


@pytest.mark.parametrize("number", sorted(native.FLOATS), ids=lambda n: native.NAMES[n])
def test_a_float_kinds_int8_arithmetic_is_float32s_on_its_tokens_rounded_to_the_kind_on_every_build(number):
    """F16's (BF16's) int8 arithmetic rounds each activation to float16 (bfloat16) as torch (and llama.cpp)
    round, nearest and ties to even, and sums as the float32 arithmetic does: bitwise, for random tokens
    and for tokens of every rounding case, at every pass width."""
    import torch

    kind, rng = native.KINDS[number], np.random.default_rng(30 + number)
    w = synthetic_blocks(rng, kind, ROWS, WIDTH)
    probes = rounding_probes(native.FLOATS[number])
    for name, kernel in builds().items():
        tiles = kernel.tile(w, number)
        # tiles of 8 rows, each 8 weights (16 bytes) of the 8 rows side by side
        laid = w.reshape(ROWS // 8, 8, -1, 16).transpose(0, 2, 1, 3).reshape(w.shape)
        assert np.array_equal(tiles, laid), f"{name}: a float kind's tiles"
        for n in COUNTS:
            x = (rng.standard_normal((n, WIDTH)) * 10.0 ** rng.integers(-3, 3, (n, 1))).astype(np.float32)
            x[:, : probes.size] = probes
            rounded = torch.from_numpy(x).to(native.FLOATS[number]).float().numpy()
            want = projected(kernel.calls(), w, number, rounded)
            got = projected(kernel.calls("int8"), tiles, number, x)
            assert np.array_equal(got, want, equal_nan=True), f"{name}, {n} tokens"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.weights > native.BLOCK], ids=lambda k: k.name)
def test_a_row_of_part_of_a_super_block_is_refused_by_name(kind):
    import torch

    assert kind.row_bytes(1536) == 6 * kind.bytes  # the Qwen2.5-Coder widths: 1536, 4864, 8960 are whole
    with pytest.raises(ValueError, match=f"{kind.name} row holds whole blocks of 256 weights; 896 is not"):
        kind.row_bytes(896)  # the 0.5B's hidden width: its tensors are in other kinds
    with pytest.raises(ValueError, match="896 is not a multiple of 256"):
        native.BlockLinear(torch.zeros(8, 4 * kind.bytes, dtype=torch.uint8), kind.number, 896)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_the_catalogue_files_tensors_of_every_kind_are_read_as_gguf_dequantises_them(model):
    """Where the catalogue's file is cached (never fetched here): the first rows of a tensor of every kind
    it holds (Q4_K, Q6_K, Q5_0, Q8_0; rows of 896 to 8960 weights) dequantise to gguf's values and give
    the float32 dot products of those values as float32 rows, bitwise, on every build; the int8 ones
    are bitwise the same on every build."""
    import torch

    from specdraft.models import find

    path = find.cached_path(find.entry(model))
    if path is None:
        pytest.skip(f"{model} is not in the cache")
    by_name = {kind.name: kind for kind in KINDS}
    tensors = {}
    for tensor in gguf.GGUFReader(str(path)).tensors:
        if tensor.tensor_type.name in by_name and tensor.name.startswith("blk."):
            tensors.setdefault(tensor.tensor_type.name, tensor)
    assert len(tensors) >= 2, sorted(tensors)
    rng = np.random.default_rng(7)
    for name, tensor in tensors.items():
        kind, width = by_name[name], int(tensor.shape[0])
        w = np.ascontiguousarray(np.asarray(tensor.data)[:ROWS])
        values = gguf.quants.dequantize(w, tensor.tensor_type)
        assert np.array_equal(native.dequantize(torch.from_numpy(w.copy()), kind.number, width).numpy(), values)
        x = rng.standard_normal((6, width)).astype(np.float32)
        int8 = {}
        for build, kernel in builds().items():
            expanded = np.full((ROWS, width), np.nan, np.float32)
            expand(w, kind.number, expanded, kernel.expand_address)
            assert np.array_equal(expanded, values), f"{tensor.name}, {build}"
            rows = np.ascontiguousarray(values).view(np.uint8)
            for n in (1, 6):
                got = projected(kernel.calls(), w, kind.number, x[:n])
                assert np.array_equal(got, projected(kernel.calls(), rows, native.F32, x[:n])), f"{tensor.name}, {build}"
            int8[build] = projected(kernel.calls("int8"), kernel.tile(w, kind.number), kind.number, x)
        assert all(np.array_equal(y, int8["portable"]) for y in int8.values()), tensor.name


def test_the_kernel_reads_a_tensor_by_its_gguf_type_and_width():
    """`kind_of`: every kind's GGUF type by name; F16 and BF16 rows only as whole 32s (GGUF's block types
    always hold whole blocks); other types not (they load as float32 copies)."""
    assert all(native.kind_of(kind.name, 256) == kind.number for kind in KINDS)
    assert native.kind_of("F16", 96) == native.F16 and native.kind_of("F16", 100) is None
    assert native.kind_of("BF16", 40) is None and native.kind_of("TQ2_0", 256) is None and native.kind_of("F32", 256) is None
