"""Prefill passes at static shapes on the batch-invariant kernels run padded to a few widths (powers
of two from `MIN_PREFILL_WIDTH`), so that prompts of any length share a few captured graphs, and
the padding changes nothing: the logits and the cache entries equal an unpadded prefill's, bit for bit.
On CPU the kernels run under Triton's interpreter (set by conftest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.tiny import TINY_VOCAB, make_tiny_model

pytest.importorskip("triton")

from specdraft.backend import RowModel, StaticShapes  # noqa: E402
from specdraft.backend.rowmodel import MIN_PREFILL_WIDTH  # noqa: E402

STATIC = StaticShapes(max_rows=2, max_context=80, kv_block=16, graphs=True)


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(dtype=torch.bfloat16, layers=1)


def prefilled(rows: RowModel, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rows.add("r", active=True)
    logits = rows.prefill("r", prompt).float().cpu()
    entries = torch.stack([torch.stack(rows.cache.entries(layer, rows.slot("r"))) for layer in range(rows.cache.num_layers)])
    return logits, entries.cpu()


@pytest.mark.parametrize("length", [5, 17, 34])
def test_a_padded_prefill_gives_the_unpadded_logits_and_entries(model, length):
    prompt = np.random.default_rng(length).integers(0, TINY_VOCAB, size=length).tolist()
    padded = RowModel(model, static=STATIC, kernels="triton", prefill_chunk=32)
    logits, entries = prefilled(padded, prompt)
    want_logits, want_entries = prefilled(RowModel(model, kernels="triton", prefill_chunk=32), prompt)
    assert torch.equal(logits, want_logits) and torch.equal(entries, want_entries)
    widths = {key[1] for key in padded._shapes}
    assert widths <= {16, 32} and padded.length("r") == length  # chunks of <= 32, padded; only real tokens kept


def test_every_prefill_width_is_warmed_without_committing_anything(model):
    rows = RowModel(model, static=STATIC, kernels="triton", prefill_chunk=64)
    assert rows.prefill_widths() == [MIN_PREFILL_WIDTH, 32, 64]
    rows.add("r", active=True)
    rows.prefill("r", [1, 2, 3])
    rows.warm_prefill("r")
    assert rows.length("r") == 3
    assert {key[1] for key in rows._shapes if not key[3]} == {16, 32, 64}  # prefill shapes (logits at one position)
    assert RowModel(model, static=STATIC, kernels="torch").prefill_widths() == []  # other layers: unpadded
    assert RowModel(model, kernels="triton").prefill_widths() == []  # no static shapes: nothing to capture
