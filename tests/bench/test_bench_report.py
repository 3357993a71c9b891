"""The benchmark report: files are written and every aggregate matches hand-computed numbers."""

from __future__ import annotations

import json

import pytest

from benchmarks.domains.report import summarize, write_report


def hf_row(pid, tps, lossless=True, source="set-a"):
    return {"id": pid, "source": source, "tokens": 10, "seconds": 10 / tps, "tokens_per_second": tps,
            "lossless": lossless, "steps": None, "draft_tokens": None, "accepted_tokens": None,
            "accepted_per_step": None, "per_position_acceptance": None, "draft_seconds": None}


def ours_row(pid, tps, seconds, steps, drafted, accepted, per_step, per_position, draft_seconds,
             lossless=True, source="set-a"):
    return {"id": pid, "source": source, "tokens": 10, "seconds": seconds, "tokens_per_second": tps,
            "lossless": lossless, "steps": steps, "draft_tokens": drafted, "accepted_tokens": accepted,
            "accepted_per_step": per_step, "per_position_acceptance": per_position, "draft_seconds": draft_seconds}


@pytest.fixture
def results():
    none_rows = [
        ours_row("p1", 10.0, 1.0, 10, 0, 0, [0] * 10, [], 0.0),
        ours_row("p2", 20.0, 1.0, 10, 0, 0, [0] * 10, [], 0.0),
        ours_row("p3", 30.0, 1.0, 10, 0, 0, [0] * 10, [], 0.0, source="set-b"),
    ]
    ngram_rows = [
        # p1: 2 steps drafting 3 each, accepted 3 then 1 -> positions 2/2, 1/2, 1/2
        ours_row("p1", 40.0, 2.0, 2, 6, 4, [3, 1], [1.0, 0.5, 0.5], 0.2),
        # p2: 4 steps drafting 2 each, accepted 0, 2, 2, 0 -> positions 2/4, 2/4
        ours_row("p2", 50.0, 3.0, 4, 8, 4, [0, 2, 2, 0], [0.5, 0.5], 0.4, lossless=False, source="set-a"),
        ours_row("p3", 90.0, 5.0, 2, 6, 0, [0, 0], [0.0, 0.0, 0.0], 0.4, source="set-b"),
    ]
    ngram_rows[1]["divergence"] = {"index": 7, "margin": 0.0123}
    return {
        "machine": "test box", "model": "tiny", "max_tokens": 10, "k": 3, "started": "2026-01-01T00:00:00+00:00",
        "cells": [
            {"domain": "code", "method": "hf-generate", "family": "hf",
             "prompts": [hf_row("p1", 5.0), hf_row("p2", 25.0), hf_row("p3", 15.0, source="set-b")]},
            {"domain": "code", "method": "hf-prompt-lookup-k10", "family": "hf",
             "prompts": [hf_row("p1", 8.0), hf_row("p2", 12.0), hf_row("p3", 100.0, source="set-b")]},
            {"domain": "code", "method": "hf-prompt-lookup-k3", "family": "hf",
             "prompts": [hf_row("p1", 30.0), hf_row("p2", 40.0), hf_row("p3", 10.0, source="set-b")]},
            {"domain": "code", "method": "specdraft-ngram", "family": "specdraft", "prompts": ngram_rows},
            {"domain": "code", "method": "specdraft-none", "family": "specdraft", "prompts": none_rows},
            {"domain": "prose", "method": "specdraft-none", "family": "specdraft", "prompts": none_rows[:2]},
            {"domain": "prose", "method": "specdraft-ngram", "family": "specdraft", "prompts": ngram_rows[:2]},
        ],
    }


def test_aggregates_match_hand_computed(results):
    summaries = {(s.domain, s.method): s for s in summarize(results)}
    ngram = summaries[("code", "specdraft-ngram")]
    assert ngram.median_tokens_per_second == 50.0
    assert ngram.speedup_vs_none == pytest.approx(50.0 / 20.0)
    assert ngram.speedup_vs_hf == pytest.approx(50.0 / 15.0)
    assert ngram.speedup_vs_hf_prompt_lookup == pytest.approx(50.0 / 30.0)  # k3's median 30 beats k10's 12
    assert ngram.acceptance_rate == pytest.approx(8 / 20)
    assert ngram.mean_accepted_length == pytest.approx(8 / 8)  # 8 accepted over 8 steps
    # Position rates weighted by draft tokens: p1 (6), p2 (8), p3 (6); p2 drafted only 2 positions.
    assert ngram.per_position_acceptance == pytest.approx([
        (1.0 * 6 + 0.5 * 8 + 0.0 * 6) / 20, (0.5 * 6 + 0.5 * 8 + 0.0 * 6) / 20, (0.5 * 6 + 0.0 * 6) / 12])
    assert ngram.drafting_share == pytest.approx(1.0 / 10.0)
    assert ngram.lossless == pytest.approx(2 / 3)

    none = summaries[("code", "specdraft-none")]
    assert none.speedup_vs_none == pytest.approx(1.0)
    assert none.acceptance_rate is None and none.mean_accepted_length is None and none.per_position_acceptance is None
    hf = summaries[("code", "hf-generate")]
    assert hf.speedup_vs_hf == pytest.approx(1.0) and hf.drafting_share is None and hf.acceptance_rate is None

    prose = summaries[("prose", "specdraft-ngram")]
    assert prose.speedup_vs_none == pytest.approx(45.0 / 15.0)  # medians of two rows: 45 and 15
    assert prose.speedup_vs_hf is None  # no hf-generate cell in prose


def test_exact_position_counts_are_pooled_when_present(results):
    cell = results["cells"][3]
    # Counts chosen to disagree with the rows' rates, so only the exact path gives these numbers.
    counts = (([2, 2, 2], [2, 1, 1]), ([4, 3], [2, 1]), ([2, 2, 2], [0, 0, 0]))
    for row, (drafted_at, accepted_at) in zip(cell["prompts"], counts):
        row["drafted_at"], row["accepted_at"] = drafted_at, accepted_at
    ngram = {(s.domain, s.method): s for s in summarize(results)}[("code", "specdraft-ngram")]
    assert ngram.per_position_acceptance == pytest.approx([4 / 8, 2 / 7, 1 / 4])


def test_write_report_writes_every_file(results, tmp_path):
    write_report(results, tmp_path / "out")
    out = tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {"results.json", "results.md", "speedup.png", "accepted_length_specdraft-ngram.png"} <= names
    assert "accepted_length_specdraft-none.png" not in names  # `none` never drafts
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    saved = json.loads((out / "results.json").read_text())
    assert saved["cells"] == results["cells"]
    assert len(saved["summary"]) == 7

    md = (out / "results.md").read_text()
    for text in ("test box", "tiny", "2026-01-01", "How to read", "## code (3 prompts)", "## prose (2 prompts)"):
        assert text in md
    ngram_line = next(line for line in md.splitlines() if line.startswith("| specdraft-ngram | 50.0"))
    cells = [c.strip() for c in ngram_line.strip("|").split("|")]
    assert cells == ["specdraft-ngram", "50.0", "2.50x", "3.33x", "1.67x", "0.40", "1.00", "0.50/0.35/0.25", "10.0%", "67% (2/3)"]
    assert "| code | specdraft-ngram | p2 | 7 | 0.012 |" in md  # the differing output, with its margin
    assert "code / set-b" in md  # by-source table
    # Methods: ours first with none leading, then Hugging Face with plain generate leading.
    order = [line.split("|")[1].strip() for line in md.split("## code (3 prompts)")[1].split("##")[0].splitlines()
             if line.startswith("| ") and not line.startswith("| method") and not line.startswith("| ---")]
    assert order == ["specdraft-none", "specdraft-ngram", "hf-generate", "hf-prompt-lookup-k10", "hf-prompt-lookup-k3"]


def test_the_engines_step_costs_are_tabled_against_its_plain_step(results, tmp_path):
    results["step_costs"] = {"plain_step_s": 0.025, "sources": {
        "model": {"draft_token_s": 0.0085, "draft_token_over_plain_step": 0.34, "catch_up_token_s": 0.003,
                  "catch_up_token_over_plain_step": 0.12},
        "hybrid/model": {"catch_up_token_s": 0.004, "catch_up_token_over_plain_step": 0.16}}}  # it never drafted
    write_report(results, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "## Step costs the engine measured (a plain step: 25.00 ms)" in md
    assert "| `model` | 8.50 | 0.340 | 3.00 | 0.120 |" in md
    assert "| `hybrid/model` | — | — | 4.00 | 0.160 |" in md


def test_llama_cpp_methods_are_peers_and_our_fastest_is_set_against_theirs(results, tmp_path):
    results["cells"] += [
        {"domain": "code", "method": "llama.cpp-lookup-k3", "family": "llama.cpp",
         "prompts": [hf_row("p1", 60.0), hf_row("p2", 70.0, lossless=False), hf_row("p3", 20.0, source="set-b")]},
        {"domain": "code", "method": "llama.cpp-plain", "family": "llama.cpp",
         "prompts": [hf_row("p1", 25.0), hf_row("p2", 25.0), hf_row("p3", 25.0, source="set-b")]},
    ]
    order = [s.method for s in summarize(results) if s.domain == "code"]
    assert order[:2] == ["specdraft-none", "specdraft-ngram"] and order[-2:] == ["llama.cpp-plain", "llama.cpp-lookup-k3"]
    write_report(results, tmp_path / "out")
    md = (tmp_path / "out" / "results.md").read_text()
    # ours: ngram's median 50; theirs: lookup's median 60 beats plain's 25
    assert "| code | specdraft-ngram (50.0) | llama.cpp-lookup-k3 (60.0) | 0.83x |" in md
    assert not (tmp_path / "out" / "accepted_length_llama.cpp-lookup-k3.png").exists()  # a peer: no plot of its own


def test_speedups_after_the_first_token_are_medians_of_decode_rates_where_every_prompt_reports_one(results, tmp_path):
    cells = {(c["domain"], c["method"]): c for c in results["cells"]}
    for (domain, method), decode in {("code", "specdraft-none"): [8.0, 12.0, 30.0],
                                     ("code", "specdraft-ngram"): [40.0, 24.0, 60.0]}.items():
        for row, rate in zip(cells[(domain, method)]["prompts"], decode):
            row["decode_tokens_per_second"] = rate
    summaries = {(s.domain, s.method): s for s in summarize(results)}
    ngram, none = summaries[("code", "specdraft-ngram")], summaries[("code", "specdraft-none")]
    assert ngram.median_decode_tokens_per_second == 40.0 and none.median_decode_tokens_per_second == 12.0
    assert ngram.decode_speedup_vs_none == pytest.approx(40.0 / 12.0)
    assert summaries[("code", "hf-generate")].median_decode_tokens_per_second is None  # reports none
    write_report(results, tmp_path / "out")
    md = (tmp_path / "out" / "results.md").read_text()
    # prose holds the first two rows of each: medians 32 and 10; the Hugging Face methods report none
    table = md[md.index("## After the first token"):md.index("## code")]
    assert "| specdraft-ngram | 3.33x (40.0) | 3.20x (32.0) |" in table and "hf-generate" not in table


def test_step_costs_are_the_cost_models_per_token_prices_against_its_plain_step():
    from types import SimpleNamespace

    from benchmarks.domains.run import step_costs
    from specdraft.policy.costs import CostModel

    costs = CostModel()
    costs.observe_verify(1, 1, 0.020)
    costs.observe_draft("model", 1, 0.008)
    costs.observe_catch_up("model", 100, 0.300)
    costs.observe_catch_up("hybrid/model", 10, 0.040)  # caught up, never drafted
    llm = SimpleNamespace(engine=SimpleNamespace(policy=SimpleNamespace(costs=costs)))
    measured = step_costs(llm)
    assert measured["plain_step_s"] == pytest.approx(0.020)
    assert measured["sources"]["model"] == pytest.approx({"draft_token_s": 0.008, "draft_token_over_plain_step": 0.4,
                                                          "catch_up_token_s": 0.003, "catch_up_token_over_plain_step": 0.15})
    assert measured["sources"]["hybrid/model"] == pytest.approx({"catch_up_token_s": 0.004,
                                                                 "catch_up_token_over_plain_step": 0.2})
