"""A row's result does not depend on the rows beside it, on every CPU path that can serve a pass: the
compiled kernel (every block kind, float32 and int8 arithmetic, every build this machine runs), numba's
own loops (float32 and int8 weights), the eager layers' linears (`FewRowsLinear`,
`WeightOnlyInt8Linear`) and a whole compiled step of up to 64 rows. Row i of a pass of n rows
(n = 1..64) is bitwise row i computed alone. `scripts/test.sh` runs this file again under
`SPECDRAFT_KERNEL_PATH=avx2` (the libraries held to AVX2 too, `specdraft.threads`), so that a machine with
AVX-512 checks what an AVX2-only CPU computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.cpu.kind_kernel import synthetic_blocks
from specdraft.backend import RowModel, native
from specdraft.backend.linear import MAX_ROWS, FewRowsLinear
from specdraft.backend.numba_layers import NO_KERNEL, NO_RESIDUAL, project
from specdraft.backend.weight_only_int8 import WeightOnlyInt8Linear
from tests.helpers.tiny import TINY_VOCAB, make_tiny_model
from tests.helpers.kernels import builds

COUNTS = [1, 2, 3, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, MAX_ROWS]
IN, OUT = 512, 80  # whole 256-weight super-blocks; five tiles of 16 rows


def alone_and_together(compute, x: np.ndarray | torch.Tensor, where: str) -> None:
    """compute(rows) -> [rows, out]: for every n of `COUNTS`, rows 0, n // 2 and n - 1 of x[:n] computed
    together equal each computed alone."""
    for n in COUNTS:
        together = compute(x[:n])
        for i in sorted({0, n // 2, n - 1}):
            alone = compute(x[i : i + 1])
            equal = torch.equal(alone, together[i : i + 1]) if torch.is_tensor(alone) else np.array_equal(alone[0], together[i])
            assert equal, f"{where}: row {i} of {n} differs from the row alone"


def projected(kernel: tuple, weights: tuple, x: np.ndarray) -> np.ndarray:
    y = np.full((x.shape[0], weights[0].shape[0]), np.nan, np.float32)
    project(weights, np.ascontiguousarray(x), y, NO_RESIDUAL, kernel)
    return y


@pytest.mark.compiles
@pytest.mark.parametrize("kind", list(native.KINDS.values()), ids=lambda kind: kind.name)
def test_the_compiled_kernels_rows_do_not_depend_on_the_row_count(kind):
    rng = np.random.default_rng(kind.number)
    w = synthetic_blocks(rng, kind, rows=OUT, width=IN)
    x = rng.standard_normal((MAX_ROWS, IN)).astype(np.float32)
    bias = rng.standard_normal(OUT).astype(np.float32)
    for name, kernel in builds().items():
        tiles = kernel.tile(w, kind.number)
        alone_and_together(lambda rows: projected(kernel.calls("int8"), (tiles, np.zeros(0, np.float32), bias, kind.number), rows),
                           x, f"{kind.name}, int8 arithmetic, {name} build")
        alone_and_together(lambda rows: projected(kernel.calls(), (w, np.zeros(0, np.float32), bias, kind.number), rows),
                           x, f"{kind.name}, float32 arithmetic, {name} build")


@pytest.mark.compiles
def test_float32_rows_do_not_depend_on_the_row_count_on_every_build_and_in_numbas_loops():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((OUT, IN)).astype(np.float32)
    x = rng.standard_normal((MAX_ROWS, IN)).astype(np.float32)
    weights = (w, np.zeros(0, np.float32), rng.standard_normal(OUT).astype(np.float32), native.F32)
    as_bytes = (np.ascontiguousarray(w).view(np.uint8), *weights[1:])
    for name, kernel in builds().items():
        alone_and_together(lambda rows: projected(kernel.calls(), as_bytes, rows), x, f"float32 rows, {name} build")
    alone_and_together(lambda rows: projected(NO_KERNEL, weights, rows), x, "numba's float32 loops")
    q = rng.integers(-127, 128, (OUT, IN), dtype=np.int8)
    scales = (rng.random(OUT) / 100).astype(np.float32)
    alone_and_together(lambda rows: projected(NO_KERNEL, (q, scales, weights[2], native.F32), rows), x,
                       "numba's int8 loops")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_eager_linears_rows_do_not_depend_on_the_row_count(dtype, bias):
    """Shapes where BLAS blocks by the row count (MKL's and OpenBLAS's products of 6 rows already sum a
    row otherwise than alone)."""
    torch.manual_seed(2)
    linear = torch.nn.Linear(576, 1536, bias=bias).to(dtype)
    x = torch.randn(MAX_ROWS, 576).to(dtype)
    with torch.inference_mode():
        if dtype == torch.float32:
            alone_and_together(FewRowsLinear(linear), x, "FewRowsLinear")
        alone_and_together(WeightOnlyInt8Linear(linear), x, f"WeightOnlyInt8Linear, {dtype} activations")


@pytest.mark.compiles
def test_a_compiled_step_of_up_to_64_rows_gives_each_row_its_logits_alone():
    """A tiny float32 Llama on the compiled step: 64 rows of different lengths fed one token each in one
    pass (two calls of the step's 32 tokens), or 8 rows fed 8 tokens each (a batch's verify pass), give
    each row the logits the row gets fed alone."""
    model = make_tiny_model(seed=5, dtype=torch.float32, layers=2)
    rng = np.random.default_rng(5)
    for rows, width in [(MAX_ROWS, 1), (8, 8), (3, 17)]:
        prompts = [rng.integers(0, TINY_VOCAB, size=3 + r % 7) for r in range(rows)]
        fed = rng.integers(0, TINY_VOCAB, size=(rows, width))
        batch = RowModel(model, compiled=True)
        assert batch.compiled_tokens > 0
        for r, prompt in enumerate(prompts):
            batch.add(str(r), active=True)
            batch.forward(batch.window_of(str(r)), prompt[None, :])
            batch.commit(batch.window_of(str(r)), [len(prompt)])
        together = batch.forward(batch.active_window, fed)  # [rows, width, vocab]
        for r in sorted({0, rows // 2, rows - 1}):
            single = RowModel(model, compiled=True)
            single.add("r", active=True)
            single.forward(single.window_of("r"), prompts[r][None, :])
            single.commit(single.window_of("r"), [len(prompts[r])])
            alone = single.forward(single.active_window, fed[r : r + 1])
            assert torch.equal(alone[0], together[r]), f"row {r} of {rows}, {width} tokens each"


@pytest.mark.compiles
def test_the_kernel_path_is_chosen_by_the_environment(monkeypatch):
    """`SPECDRAFT_KERNEL_PATH` picks the build every model loads (`native.kernel()`); a value that is not
    a path is refused by name."""
    if not native.kernel("native").avx2:
        pytest.skip("no AVX2 here: every path is the portable loops")
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "avx2")
    assert native.kernel().code == "avx2" and native.kernel() is native.kernel("avx2")
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "portable")
    assert native.kernel().code == "portable"
    monkeypatch.setenv("SPECDRAFT_KERNEL_PATH", "avx3")
    with pytest.raises(ValueError, match="SPECDRAFT_KERNEL_PATH must be one of native, ymm, avx2, portable, got 'avx3'"):
        native.kernel()
