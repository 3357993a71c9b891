"""`benchmarks.gpu_step` (the GPU verify-step benchmark) runs on CPU at tiny shapes: every batch and
k measured for both models and Hugging Face's static-cache forward, the floor, the cost ratio, and
the implied speed-up by Leviathan et al.'s formula; the GPU preparation script's plan fits the
device tool's limits."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import gpu_step


def test_the_implied_speedup_is_leviathans_expected_tokens_over_the_step_cost():
    speedup, k = gpu_step.implied_speedup(0.1, {0: 1.0, 1: 1.05, 5: 1.2}, 0.8)
    assert k == 5
    assert speedup == pytest.approx((1 - 0.8 ** 6) / 0.2 / (5 * 0.1 + 1.2))
    assert gpu_step.implied_speedup(0.9, {0: 1.0, 1: 1.5}, 0.6)[0] < 1  # a costly draft loses


@pytest.mark.slow
def test_gpu_step_runs_on_cpu_at_tiny_shapes(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_step", "--shapes", "tiny-small,tiny", "--batches", "1,2", "--ks", "0,3",
                                      "--repeats", "1", "--context", "16", "--dtype", "float32", "--out", str(tmp_path)])
    gpu_step.main()
    result = json.loads((tmp_path / "gpu_step_cpu.json").read_text())
    assert set(result["models"]) == {"tiny-small", "tiny"}
    for model in result["models"].values():
        assert [(c["batch"], c["k"]) for c in model["cells"]] == [(1, 0), (1, 3), (2, 0), (2, 3)]
        for cell in model["cells"]:
            assert cell["ours_graphs_off_ms"] > 0 and cell["hf_static_ms"] > 0  # no CUDA graphs on CPU
        assert model["floor_ms"] > 0
    assert result["cost_ratio_c"] > 0
    assert [r["acceptance"] for r in result["implied_speedup"]] == list(gpu_step.ACCEPTANCE)
    assert "| 2 | 3 |" in (tmp_path / "gpu_step_cpu.md").read_text()


def _prepare_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "gpu_prepare.py"
    spec = importlib.util.spec_from_file_location("gpu_prepare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_preparation_splits_the_gguf_and_fits_each_call_under_the_tools_limit(tmp_path):
    prepare = _prepare_module()
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 1001)
    parts = [tmp_path / "call1" / "model.part1", tmp_path / "call2" / "model.part2"]
    prepare.split(source, 2, parts)
    assert b"".join(p.read_bytes() for p in parts) == source.read_bytes()
    assert abs(parts[0].stat().st_size - parts[1].stat().st_size) <= 1
    mb = 1 << 20
    calls = prepare.plan_calls({"a.whl": 6 * mb, "b.whl": 5 * mb, "c.whl": 4 * mb},
                               [{"part1": 48 * mb}, {"part2": 47 * mb}], limit=60 * mb)
    assert all(sum(c.values()) <= 60 * mb for c in calls)
    assert sorted(n for c in calls for n in c if n.endswith(".whl")) == ["a.whl", "b.whl", "c.whl"]
    with pytest.raises(ValueError, match="fits in no call"):
        prepare.plan_calls({"big.whl": 20 * mb}, [{"part1": 48 * mb}, {"part2": 47 * mb}], limit=60 * mb)
