"""The kind files the per-kind speed runs time (`benchmarks.cpu.kind_files`): a small one of each kind
that only joined the kernel's table lately loads whole through specdraft with its projections read as
that kind's blocks, and decodes greedily exactly as the same file read dense (float32 arithmetic)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.cpu.kind_files import SHAPES, VOCAB, write_kind_file
from specdraft.backend import native

pytest.importorskip("gguf")


def greedy(loaded, prompt: list[int], steps: int) -> list[int]:
    from specdraft.backend import RowModel

    rows = RowModel(loaded.model, compiled=True)
    rows.add("r", active=True)
    out = [int(rows.prefill("r", prompt).argmax())]
    for _ in range(steps):
        out.append(int(rows.forward(rows.active_window, [[out[-1]]])[0, -1].argmax()))
        rows.commit(rows.active_window, [1])
    return out


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_1", "IQ4_NL", "Q4_K", "Q5_K", "IQ4_XS", "Q3_K", "Q2_K", "F16", "BF16"])
def test_a_kind_file_reads_its_projections_as_blocks_and_decodes_as_read_dense(kind, tmp_path):
    from specdraft.models import load_model

    path = write_kind_file(tmp_path / f"{kind}.gguf", kind, SHAPES["small"])
    ours = load_model(str(path), device="cpu", dtype="float32", arithmetic="float32")
    dense = load_model(str(path), device="cpu", dtype="float32", weights="dense")
    assert load_model(str(path), device="cpu", dtype="float32", arithmetic="int8").arithmetic == "int8"
    down = ours.model.model.layers[1].mlp.down_proj
    assert ours.weights == "native" and native.NAMES[down.kind] == kind
    assert torch.equal(down.dense(), dense.model.model.layers[1].mlp.down_proj.weight)
    prompt = [(7 * i + 3) % VOCAB for i in range(20)]
    assert greedy(ours, prompt, 12) == greedy(dense, prompt, 12)
