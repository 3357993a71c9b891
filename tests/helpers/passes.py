"""A row's logits pass by pass: a prefill chunk, then passes of random tokens (committed), through a
`RowModel` on numba's compiled layers, for comparing two models' arithmetic pass for pass."""

from __future__ import annotations

import numpy as np

from specdraft.backend import RowModel
from specdraft.backend.numba_layers import NumbaLayers
from tests.helpers.tiny import TINY_VOCAB


def pass_logits(model, prompt, counts):
    """The logits of `prompt` prefilled in one chunk, then of each pass of `counts` random tokens."""
    rows = RowModel(model, compiled=True)
    assert isinstance(rows.compiled_layers, NumbaLayers)
    rows.add("r", active=True)
    first = rows.prefill("r", prompt).clone()  # a prefill chunk: longer than the compiled passes
    return [first, *row_passes_after(rows, counts)]


def row_passes_after(rows, counts):
    """The logits of passes of `counts` random tokens each, committed, on a row already prefilled."""
    out, rng = [], np.random.default_rng(0)
    for n in counts:
        ids = rng.integers(0, TINY_VOCAB, size=(1, n))
        out.append(rows.forward(rows.active_window, ids).clone())
        rows.commit(rows.active_window, [n])
    return out
