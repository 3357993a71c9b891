"""The agent-under-load, compare and native-kernel reports: figures computed from hand-made rows; the
projections benchmark measured on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cpu import projections
from benchmarks.domains.methods import Methods, display_order
from benchmarks.serving import agent_load
from tests.helpers.tiny import loaded


def _request(conversation: str, turn: int, text: str, tps: float, decode: float, cached: int = 0) -> dict:
    return {"conversation": conversation, "turn": turn, "text": text, "tokens_per_second": tps,
            "decode_tokens_per_second": decode, "ttft": 1.0, "steps": 4, "draft_tokens": 6, "accepted_tokens": 3,
            "prompt_tokens": 200, "cached_tokens": cached}


def test_agent_load_pairs_memory_on_and_off_turn_by_turn(tmp_path):
    def run(method: str, tps: list[float], texts=("a", "b", "c")) -> dict:
        requests = [_request("c1", t, texts[t], tps[t], 2 * tps[t], cached=50 * t) for t in range(3)]
        return {"conversations": 4, "repeat": 0, "method": method, "tokens_per_second": sum(tps), "requests": requests}

    runs = [run("none", [1.0, 1.0, 1.0]), run("ngram", [2.0, 2.0, 4.0]),
            run("ngram+memory", [2.0, 3.0, 6.0], texts=("a", "x", "c"))]
    s = agent_load.summarize(runs)["4"]
    memory = s["memory_over_no_memory"]
    assert memory["1"]["tokens_per_second"] == pytest.approx(1.0)
    assert memory["2"]["tokens_per_second"] == pytest.approx(1.5)
    assert memory["3+"]["decode_tokens_per_second"] == pytest.approx(1.5)
    assert memory["all"]["turns"] == 3
    on = s["methods"]["ngram+memory"]
    assert on["tokens_per_second"] == 11.0
    assert on["by_turn"]["all"]["equal_to_none"] == 2  # its second reply differs from none's
    assert on["by_turn"]["all"]["tokens_per_step"] == pytest.approx((12 + 9) / 12)
    assert on["by_turn"]["all"]["cached_share"] == pytest.approx(0.25)  # median of 0, 50 and 100 of 200
    assert on["by_turn"]["3+"]["cached_share"] == pytest.approx(0.5)
    results = {"machine": "m", "max_tokens": 8, "repeats": 1, "summary": agent_load.summarize(runs)}
    text = agent_load.render(results)
    assert "## 4 conversations at once" in text and "- turn 2: tok/s 1.50x" in text
    agent_load.plot(results, tmp_path / "load.png")
    assert (tmp_path / "load.png").read_bytes()[:4] == b"\x89PNG"


def test_a_memory_state_keeps_repeats_of_a_prompt_from_learning_from_each_other(tiny_model):
    methods = Methods(loaded(tiny_model), ("ngram+memory", "none"), k=5, max_tokens=24, long_ks=(8,))
    assert methods.names == ["none", "ngram+memory", "ngram k=8"]
    ids = [5, 6, 7, 8, 9, 10, 5, 6]
    before = methods.memory_state()
    first = methods.run("ngram+memory", ids, before)
    once = methods.memory_state()
    again = methods.run("ngram+memory", ids, before)  # put back first: learns the output once, not twice
    assert all(np.array_equal(a, b) for a, b in zip(methods.memory_state(), once))
    assert again["token_ids"] == first["token_ids"] == methods.run("none", ids)["token_ids"] \
        == methods.run("ngram k=8", ids)["token_ids"]
    methods.run("ngram+memory", ids)  # no state: it learns on top of what it knew
    counts = methods.memory_state()[1]
    assert counts.sum() > once[1].sum() > before[1].sum()


def test_display_order_puts_ours_first_and_longer_drafts_by_length():
    names = ["hf-generate", "ngram k=16", "ngram+memory", "ngram k=5", "none", "hf-prompt-lookup-k10", "ngram"]
    assert display_order(names) == ["none", "ngram", "ngram+memory", "ngram k=5", "ngram k=16", "hf-generate",
                                    "hf-prompt-lookup-k10"]


def test_projections_report_every_kernel_and_token_count(tmp_path, monkeypatch):
    import torch

    from specdraft.backend import RowModel
    from specdraft.backend.numba_layers import read_parts, step_weights
    from tests.helpers.tiny import make_tiny_model

    monkeypatch.setattr(projections, "TOKENS", (1, 3))
    model = make_tiny_model(seed=3, dtype=torch.float32)
    RowModel(model, compiled=True)
    weights = read_parts(step_weights(model, list(model.model.layers)))
    result = projections.measure(weights, rounds=1)
    assert result["weight_bytes"] == sum(w[0].nbytes for w in weights)
    assert "ours (numba)" in result["kernels"] and "F.linear (MKL)" in result["kernels"]
    for rows in result["kernels"].values():
        assert [r["tokens"] for r in rows] == [1, 3]
        for r in rows:
            assert r["streamed_ms"] > 0 and r["in_cache_ms"] > 0
            assert r["overlapped_ms"] == pytest.approx(max(rows[0]["streamed_ms"], r["in_cache_ms"]))
    projections.write({"date": "d", "machine": "m", "load_before": 0.1, "threads": 2, "model": "x", "rounds": 1,
                       **result}, tmp_path)
    text = (tmp_path / "projections.md").read_text()
    assert "## ours (numba)" in text and "| 3 |" in text


def test_compare_puts_each_runs_figures_side_by_side(tmp_path):
    from benchmarks.domains import compare

    def run(none: float, ngram: float) -> dict:
        rows = lambda tps: [{"id": "p", "tokens": 10, "seconds": 1.0, "tokens_per_second": tps, "lossless": True}]  # noqa: E731
        return {"cells": [{"domain": "code", "method": "specdraft-none", "prompts": rows(none)},
                          {"domain": "code", "method": "specdraft-ngram", "prompts": rows(ngram)}]}

    result = compare.compare({"before": [run(10, 12), run(10, 13)], "after": [run(20, 25)]})
    [ngram] = [r for r in result["cells"] if r["method"] == "specdraft-ngram"]
    assert ngram["groups"]["before"]["speedup_range"] == pytest.approx([1.2, 1.3])
    assert ngram["groups"]["after"]["median_speedup"] == pytest.approx(1.25)
    text = compare.render(result, "t")
    assert "| code | specdraft-ngram | 12.0 (1.20x) / 13.0 (1.30x) | 25.0 (1.25x) | 1.25x | 1.25x | before: 1/1 1/1; after: 1/1 |" in text


def test_native_kernel_report_puts_projections_beside_the_step_and_says_whether_native_equals_dense(tmp_path):
    from benchmarks.cpu import native_kernel

    kinds = list(native_kernel.KINDS)
    result = {"date": "d", "machine": "m", "load_before": 0.1, "threads": 2, "rounds": 3, "avx2": True,
              "projections_ms": {1: {k: 9.0 + i for i, k in enumerate(kinds)}, 6: {k: 20.0 for k in kinds}},
              "native_equals_dense": {1: True, 6: False},
              "step_ms": {k: {1: 13.0, 6: 38.0} for k in kinds},
              "in_cache": {"native N=1": {"us": 220.0, "gweights_per_s": 8.0}}}
    native_kernel.write(result, tmp_path)
    text = (tmp_path / "native_kernel.md").read_text()
    assert "| 1 | 9.0 / 13.0 | 10.0 / 13.0 | 11.0 / 13.0 | bitwise |" in text
    assert "| 6 | 20.0 / 38.0 | 20.0 / 38.0 | 20.0 / 38.0 | NO |" in text
    assert "8.0 G weights/s" in text


def test_repeated_runs_interleave_and_keep_the_run_of_median_speed():
    from benchmarks.domains.run import run_repeated
    order, speeds = [], {"a": iter([30.0, 10.0, 20.0]), "b": iter([5.0, 6.0, 7.0])}

    def method(name):
        def run(ids):
            order.append(name)
            return {"token_ids": list(ids), "tokens_per_second": next(speeds[name]), "name": name}
        return run

    rows = run_repeated({"a": method("a"), "b": method("b")}, [1, 2], repeats=3)
    assert order == ["a", "b", "b", "a", "a", "b"]  # round r starts at the r-th method
    assert rows["a"]["tokens_per_second"] == 20.0 and rows["b"]["tokens_per_second"] == 6.0
    assert rows["a"]["runs_tokens_per_second"] == [30.0, 10.0, 20.0] and rows["a"]["same_tokens_every_run"]
