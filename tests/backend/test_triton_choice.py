"""How the Triton kernels launch (`triton_kernels.Choice`: tiles, pipeline, programmatic dependent
launch) and int8 weights with per-output scales (the draft copy's), on the batch-invariant kernels.

On CPU the kernels run under Triton's interpreter (set by conftest), where programmatic dependent
launch is never used; with SPECDRAFT_TEST_DEVICE=cuda on a Hopper GPU the same tests launch with it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.helpers.tiny import TEST_DEVICE, TINY_VOCAB, make_tiny_model

pytest.importorskip("triton")

from specdraft.backend import RowModel  # noqa: E402
from specdraft.backend import triton_kernels as tk  # noqa: E402
from specdraft.backend.weight_only_int8 import use_weight_only_int8  # noqa: E402

DTYPE = torch.bfloat16
PDL = tk.pdl_available(TEST_DEVICE)


def test_a_choice_is_parsed_from_its_fields_and_a_bad_one_is_named():
    choice = tk.Choice.parse("pdl=1, block_k=128,stages=4,target=256")
    assert (choice.pdl, choice.block_k, choice.stages, choice.target, choice.block_o) == (True, 128, 4, 256, 64)
    assert tk.Choice.parse(choice.describe()) == choice
    assert tk.Choice.parse("") == tk.Choice()
    for bad in ("blocks=3", "pdl=yes", "stages"):
        with pytest.raises(ValueError, match="SPECDRAFT_TRITON_CHOICE"):
            tk.Choice.parse(bad)


def test_pdl_is_used_only_where_the_device_has_it():
    assert not tk.pdl_available(torch.device("cpu"))
    model = make_tiny_model(dtype=DTYPE, layers=1)
    rows = RowModel(model, kernels="triton")
    assert rows.invariant_layers.pdl == (tk.CHOICE.pdl and PDL)
    layers = type(rows.invariant_layers)(model, list(model.model.layers), DTYPE, rows.family, tk.Choice(pdl=True))
    assert layers.pdl == PDL


@pytest.mark.parametrize("choice", [tk.Choice(), tk.Choice(block_k=128, stages=4, target=256, pdl=True)],
                         ids=["default", "wide+pdl"])
@pytest.mark.parametrize("rows", [1, 7, 17])
def test_int8_weights_rows_do_not_depend_on_the_row_count_and_scale_each_output(rows, choice, monkeypatch):
    """Int8 weights widened exactly to the activations' dtype, sums times each output's scale:
    row i alone equals row i among n (split in-features too), and the product is the dequantised one."""
    monkeypatch.setattr(tk, "MIN_SPLIT_WEIGHTS", 0)
    g = torch.Generator().manual_seed(rows)
    n_in, n_out = 1024, 96
    weight = torch.randint(-127, 128, (n_out, n_in), generator=g, dtype=torch.int8).to(TEST_DEVICE)
    scales = (torch.rand(n_out, generator=g) / 100 + 1e-3).to(DTYPE).to(TEST_DEVICE)
    bias = torch.randn(n_out, generator=g).to(DTYPE).to(TEST_DEVICE)
    x = torch.randn(rows, n_in, generator=g).to(DTYPE).to(TEST_DEVICE)
    tiled = choice.tiling(n_out, n_in)
    assert tiled.splits > 1
    pdl = choice.pdl and PDL
    together = tk.linear(x, weight, bias, scales=scales, tiled=tiled, pdl=pdl, out_dtype=torch.float32)
    for i in sorted({0, rows // 2, rows - 1}):
        alone = tk.linear(x[i : i + 1], weight, bias, scales=scales, tiled=tiled, pdl=pdl, out_dtype=torch.float32)
        assert torch.equal(alone, together[i : i + 1]), f"row {i} of {rows}"
    expected = x.double() @ (weight.double() * scales.double()[:, None]).T + bias.double()
    assert (together.double() - expected).abs().max() < 1e-3 * expected.abs().max()
    with pytest.raises(AssertionError, match="scales"):
        tk.linear(x, weight, bias)


def test_an_int8_draft_copy_runs_on_the_triton_kernels_and_computes_its_modules_function():
    """The self-draft's int8 copy (`WeightOnlyInt8Linear` everywhere, the head too) on the Triton
    kernels, in the target's bf16: the same function as its torch modules (not bitwise: other roundings)."""
    model = make_tiny_model(dtype=DTYPE, layers=2)
    draft = copy.deepcopy(model)
    assert use_weight_only_int8(draft) == 2 * 7 + 1
    triton_rows, torch_rows = RowModel(draft, kernels="triton"), RowModel(draft, kernels="torch")
    assert triton_rows.invariant_layers is not None and torch_rows.invariant_layers is None
    ids = np.random.default_rng(5).integers(0, TINY_VOCAB, size=20).tolist()
    for rows in (triton_rows, torch_rows):
        rows.add("r", active=True)
    got, want = triton_rows.prefill("r", ids).float(), torch_rows.prefill("r", ids).float()
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert got.argmax() == want.argmax()
