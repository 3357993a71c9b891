"""`benchmarks.gpu.step` (the GPU verify-step benchmark) runs on CPU at tiny shapes: every batch and
k measured for both models and Hugging Face's static-cache forward, the floor, the cost ratio, and
the implied speed-up by Leviathan et al.'s formula (the GPU scripts' own tests: test_gpu_scripts.py)."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks.gpu import step as gpu_step


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
            assert cell["ours_auto_graphs_off_ms"] > 0 and cell["hf_static_ms"] > 0  # no CUDA graphs on CPU
            assert "ours_auto_graphs_on_ms" not in cell
        assert model["floor_ms"] > 0
    assert result["cost_ratio_c"] > 0
    assert [r["acceptance"] for r in result["implied_speedup"]] == list(gpu_step.ACCEPTANCE)
    assert result["kernels"] == ["auto"] and result["errors"] == {}
    markdown = (tmp_path / "gpu_step_cpu.md").read_text()
    assert "| batch | k | ours auto, graphs on | ours auto, graphs off | HF static cache |" in markdown
    assert "| 2 | 3 | — |" in markdown


def test_a_kernel_choice_or_baseline_that_failed_is_reported_beside_the_others(tmp_path):
    cells = [{"batch": 1, "k": 0, "ours_triton_graphs_on_ms": 1.5, "hf_static_ms": None},
             {"batch": 1, "k": 5, "ours_triton_graphs_on_ms": 2.0, "hf_static_ms": 2.5}]
    result = {"date": "2026-11-27", "machine": "a GPU", "device": "cuda:0", "dtype": "bfloat16", "context": 256,
              "repeats": 10, "copy_bandwidth_gb_s": 4000.0, "kernels": ["triton", "torch"],
              "errors": {"1b ours_torch_graphs_on_ms": "RuntimeError: boom"},
              "models": {"1b": {"weight_bytes": 2_000_000_000, "floor_ms": 0.5, "cells": cells}}}
    gpu_step.write(result, tmp_path, ["1b", "3b"])
    markdown = (tmp_path / "gpu_step_cuda.md").read_text()
    assert "| batch | k | ours triton, graphs on | ours triton, graphs off | ours torch, graphs on |" in markdown
    assert "| 1 | 0 | 1.50 | — | — | — | — | 3.0x |" in markdown
    assert "| 1 | 5 | 2.00 | — | — | — | 2.50 | 4.0x |" in markdown
    assert "- 1b ours_torch_graphs_on_ms: RuntimeError: boom" in markdown
    assert "Cost ratio c: not measured" in markdown
