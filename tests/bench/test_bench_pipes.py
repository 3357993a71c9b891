"""The pipes' limit (`benchmarks.cpu.pipes`): its loops compile and run here and give a rate for each
line (how fast is the benchmark's to say, not a test's); a GGUF's weights a pass multiplies are its
matrices', the tied embedding counted once as the output layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cpu.pipes import LINES, model_weights, rates

pytest.importorskip("gguf")


def test_the_embedded_models_matrices_are_the_weights_a_pass_multiplies():
    # SmolLM2-135M: 30 layers of q, o 576 x 576, k, v 192 x 576, gate, up, down 576 x 1536; its output layer
    # is its 49152 x 576 embedding (tied: no output.weight in the file)
    layer = 2 * 576 * 576 + 2 * 192 * 576 + 3 * 576 * 1536
    assert sum(model_weights("SmolLM2-135M-Instruct").values()) == 30 * layer + 49152 * 576


CPUINFO = Path("/proc/cpuinfo")


@pytest.mark.skipif(not CPUINFO.is_file() or " avx2" not in CPUINFO.read_text(), reason="the loops are AVX2's")
def test_the_loops_run_and_give_each_instructions_rate():
    measured = rates()
    assert set(measured) == set(LINES)
    assert all(value > 0 for value in measured.values())
