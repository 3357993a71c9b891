"""Turn a benchmark results dict into results.json, results.md and PNG plots (`plots.py` draws them).

Every aggregate is computed here from the per-prompt rows, so the JSON holds the raw numbers and
the markdown can be recomputed from it. Schema of `results` (extra keys are kept as they are):

    {"machine", "model", "max_tokens", "k", "started",
     "cells": [{"domain", "method", "family": "specdraft" | "hf" | "llama.cpp",
                "prompts": [{"id", "tokens", "seconds", "tokens_per_second", "lossless", "steps",
                             "draft_tokens", "accepted_tokens", "accepted_per_step",
                             "per_position_acceptance", "draft_seconds"}]}]}

Rows may also carry "source" (the prompt's data set: adds a by-source table), "divergence"
({"index", "margin"}: listed under the differing outputs), and "drafted_at" / "accepted_at"
(per-position counts: pooled exactly instead of weighting each prompt's rates by its draft tokens).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.domains.names import BASELINE, HF_PLAIN, LLAMA_CPP, family, is_peer, method_order
from benchmarks.domains.plots import plot_accepted, plot_speedup

DASH = "—"


@dataclass(frozen=True)
class CellSummary:
    domain: str
    method: str
    family: str
    prompts: int
    median_tokens_per_second: float
    speedup_vs_none: float | None
    median_decode_tokens_per_second: float | None  # after the first token (None: a method that does not report it)
    decode_speedup_vs_none: float | None
    speedup_vs_hf: float | None
    speedup_vs_hf_prompt_lookup: float | None  # vs the fastest hf-prompt-lookup-* cell of the domain
    acceptance_rate: float | None
    mean_accepted_length: float | None
    per_position_acceptance: list[float] | None
    drafting_share: float | None
    lossless: float | None  # share of prompts whose output equals its reference's (hf-generate's, or int8 none's)
    lossless_count: int
    lossless_known: int


def _values(rows: list[dict], key: str) -> list:
    return [r[key] for r in rows if r.get(key) is not None]


def _median_tps(rows: list[dict]) -> float:
    return statistics.median(_values(rows, "tokens_per_second")) if rows else 0.0


def _per_position(rows: list[dict]) -> list[float] | None:
    if rows and all(r.get("drafted_at") is not None and r.get("accepted_at") is not None for r in rows):
        width = max(len(r["drafted_at"]) for r in rows)
        drafted, accepted = [0] * width, [0] * width
        for r in rows:
            for i, (d, a) in enumerate(zip(r["drafted_at"], r["accepted_at"])):
                drafted[i] += d
                accepted[i] += a
        rates = [a / d for d, a in zip(drafted, accepted) if d]
        return rates or None
    # Rates only: weight each prompt's rate at a position by its draft tokens (a proxy for how many of
    # its drafts reached that position; exact pooling needs the counts above).
    rated = [(r["per_position_acceptance"], r.get("draft_tokens") or 1) for r in rows if r.get("per_position_acceptance")]
    if not rated:
        return None
    width = max(len(rates) for rates, _ in rated)
    out = []
    for i in range(width):
        pairs = [(rates[i], w) for rates, w in rated if i < len(rates)]
        out.append(sum(rate * w for rate, w in pairs) / sum(w for _, w in pairs))
    return out


def _median_decode_tps(rows: list[dict]) -> float | None:
    """The median over prompts of tok/s after the first token (where every prompt reports it)."""
    values = _values(rows, "decode_tokens_per_second")
    return statistics.median(values) if rows and len(values) == len(rows) else None


def summarize_cell(cell: dict, baseline_tps: float | None, hf_tps: float | None, lookup_tps: float | None,
                   baseline_decode_tps: float | None = None) -> CellSummary:
    rows = cell["prompts"]
    tps, decode_tps = _median_tps(rows), _median_decode_tps(rows)
    drafted = sum(_values(rows, "draft_tokens"))
    accepted = sum(_values(rows, "accepted_tokens"))
    per_step = [a for r in rows for a in (r.get("accepted_per_step") or [])]
    steps = sum(_values(rows, "steps"))
    if per_step:
        mean_accepted = statistics.fmean(per_step)
    else:
        mean_accepted = accepted / steps if steps else None
    draft_seconds = _values(rows, "draft_seconds")
    seconds = sum(r["seconds"] for r in rows)
    known = _values(rows, "lossless")
    return CellSummary(
        domain=cell["domain"],
        method=cell["method"],
        family=cell.get("family", family(cell["method"])),
        prompts=len(rows),
        median_tokens_per_second=tps,
        speedup_vs_none=tps / baseline_tps if baseline_tps else None,
        median_decode_tokens_per_second=decode_tps,
        decode_speedup_vs_none=decode_tps / baseline_decode_tps if decode_tps and baseline_decode_tps else None,
        speedup_vs_hf=tps / hf_tps if hf_tps else None,
        speedup_vs_hf_prompt_lookup=tps / lookup_tps if lookup_tps else None,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_length=mean_accepted if drafted else None,
        per_position_acceptance=_per_position(rows) if drafted else None,
        drafting_share=sum(draft_seconds) / seconds if draft_seconds and seconds > 0 else None,
        lossless=sum(known) / len(known) if known else None,
        lossless_count=sum(known),
        lossless_known=len(known),
    )


def summarize(results: dict) -> list[CellSummary]:
    """One summary per cell, in domain order of first appearance and method order of `method_order`."""
    cells = results["cells"]
    domains = list(dict.fromkeys(c["domain"] for c in cells))
    order = method_order([c["method"] for c in cells])
    summaries = []
    for domain in domains:
        here = {c["method"]: c for c in cells if c["domain"] == domain}
        medians = {m: _median_tps(c["prompts"]) for m, c in here.items()}
        lookups = [v for m, v in medians.items() if m.startswith("hf-prompt-lookup")]
        baseline_decode = _median_decode_tps(here[BASELINE]["prompts"]) if BASELINE in here else None
        for method in order:
            if method in here:
                summaries.append(summarize_cell(here[method], medians.get(BASELINE), medians.get(HF_PLAIN),
                                                max(lookups) if lookups else None, baseline_decode))
    return summaries


# -- markdown --------------------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else DASH


def _f(value: float | None, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if value is not None else DASH


def _pct(value: float | None, digits: int = 0) -> str:
    return f"{100 * value:.{digits}f}%" if value is not None else DASH


def _positions(rates: list[float] | None) -> str:
    return "/".join(f"{r:.2f}" for r in rates) if rates else DASH


def _lossless(s: CellSummary) -> str:
    if s.lossless is None:
        return DASH
    return f"{_pct(s.lossless)} ({s.lossless_count}/{s.lossless_known})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _by_source(results: dict) -> list[str]:
    """Speedup vs specdraft-none per prompt source (ratio of medians within the source)."""
    columns: list[tuple[str, str]] = []
    speed: dict[tuple[str, str, str], float] = {}
    for cell in results["cells"]:
        for row in cell["prompts"]:
            if row.get("source") is None:
                continue
            column = (cell["domain"], row["source"])
            if column not in columns:
                columns.append(column)
    if not columns:
        return []
    for cell in results["cells"]:
        for domain, source in columns:
            if cell["domain"] == domain:
                rows = [r for r in cell["prompts"] if r.get("source") == source]
                if rows:
                    speed[(cell["method"], domain, source)] = _median_tps(rows)
    methods = method_order([c["method"] for c in results["cells"]])
    body = []
    for method in methods:
        cells = []
        for domain, source in columns:
            tps, base = speed.get((method, domain, source)), speed.get((BASELINE, domain, source))
            cells.append(_x(tps / base) if tps is not None and base else DASH)
        body.append([method] + cells)
    return ["## Speedup vs specdraft-none by prompt source", ""] + _table(
        ["method"] + [f"{d} / {s}" for d, s in columns], body) + [""]


def _divergences(results: dict) -> list[str]:
    rows = []
    for cell in results["cells"]:
        for row in cell["prompts"]:
            if row.get("lossless") is False:
                div = row.get("divergence") or {}
                rows.append([cell["domain"], cell["method"], str(row["id"]),
                             str(div.get("index", DASH)), _f(div.get("margin"), 3)])
    if not rows:
        return []
    return [
        "## Outputs that differ from their reference (hf-generate's, specdraft-none's in int8, llama.cpp-plain's)",
        "",
        "First token index where the output leaves its reference's, and the stock model's top-2 logit margin "
        "there (a margin near 0 is a near-tie: float rounding in a differently shaped forward can flip it).",
        "",
    ] + _table(["domain", "method", "prompt", "first differing token", "top-2 margin"], rows) + [""]


def _preamble(results: dict) -> list[str]:
    """The title, the run's setup and how to read the tables."""
    return [
        "# specdraft benchmark: code, JSON and prose",
        "",
        f"- Machine: {results.get('machine', DASH)}",
        f"- Model: {results.get('model', DASH)}",
        *([f"- Setup: {results['setup']}"] if results.get("setup") else []),
        f"- Date: {results.get('started', DASH)}",
        f"- Max new tokens: {results.get('max_tokens', DASH)}; our draft length k = {results.get('k', DASH)}; "
        + (f"sampling at temperature {results['temperature']}, every request with seed {results['seed']} (each method "
           "draws the same numbers, so its output must equal specdraft-none's)" if results.get("temperature")
           else "greedy"),
        "",
        "**How to read.** Every method decodes the same prompts the same way with the same token budget. "
        "*tok/s* is the median over prompts of generated tokens per wall second (prefill included)"
        + (f"; each specdraft method ran {results['runs_per_prompt']} times per prompt, interleaved, and a "
           "prompt's figure is its run of median speed. " if results.get("runs_per_prompt", 1) > 1 else ". ") +
        "Speedups are ratios of those medians to `specdraft-none` (our plain decoding) and to `hf-generate` "
        "(Hugging Face plain `generate`); *vs HF lookup* is against the faster of Hugging Face's prompt-lookup "
        "settings. *Acceptance* is accepted draft tokens over drafted tokens, summed over prompts; "
        "*mean accepted* is the mean over decoding steps of accepted draft tokens (each step also yields "
        "one token from the target); *per position* is the acceptance rate at draft positions 1, 2, ... "
        "among steps whose draft reached that position. *Drafting share* is the share of wall time spent in "
        "the drafter. *Lossless* is the share of prompts whose output equals plain decoding's in the same "
        "arithmetic token for token: `hf-generate`'s for float32, `specdraft-none`'s for int8 (the JSON's "
        "`lossless_reference`); llama.cpp's methods are held to its own plain decoding's. "
        "A dash means the value does not apply (no drafts, or a Hugging Face method that does not report it).",
        "",
    ]


def _summary(summaries: list[CellSummary], domains: list[str]) -> list[str]:
    """Every method's speedup vs specdraft-none, one column per domain."""
    methods = method_order([s.method for s in summaries])
    by_key = {(s.domain, s.method): s for s in summaries}
    lines = ["## Summary: speedup vs specdraft-none (median tok/s in brackets)", ""]
    return lines + _table(["method"] + domains, [
        [m] + [f"{_x(by_key[(d, m)].speedup_vs_none)} ({by_key[(d, m)].median_tokens_per_second:.1f})"
               if (d, m) in by_key else DASH for d in domains]
        for m in methods
    ]) + [""]


def _decode_summary(summaries: list[CellSummary], domains: list[str]) -> list[str]:
    """Every method's speedup vs specdraft-none after the first token (median decode tok/s in brackets):
    what drafting changes, the prompt's prefill left out (none where no method reports it)."""
    by_key = {(s.domain, s.method): s for s in summaries if s.median_decode_tokens_per_second is not None}
    if not by_key:
        return []
    methods = [m for m in method_order([s.method for s in summaries]) if any((d, m) in by_key for d in domains)]
    lines = ["## After the first token: speedup vs specdraft-none (median decode tok/s in brackets)", "",
             "The tokens after the first over the seconds after it: the prompt's prefill, which no drafter "
             "shortens, left out (llama.cpp's: its own decode timing).", ""]
    return lines + _table(["method"] + domains, [
        [m] + [f"{_x(by_key[(d, m)].decode_speedup_vs_none)} ({by_key[(d, m)].median_decode_tokens_per_second:.1f})"
               if (d, m) in by_key else DASH for d in domains]
        for m in methods
    ]) + [""]


def _against_llama_cpp(summaries: list[CellSummary], domains: list[str]) -> list[str]:
    """Per domain, our fastest method against llama.cpp's fastest (median tok/s), where llama.cpp ran."""
    rows = []
    for d in domains:
        here = [s for s in summaries if s.domain == d]
        ours = max((s for s in here if not is_peer(s.method)), key=lambda s: s.median_tokens_per_second, default=None)
        theirs = max((s for s in here if s.method.startswith(LLAMA_CPP)), key=lambda s: s.median_tokens_per_second,
                     default=None)
        if ours and theirs:
            rows.append([d, f"{ours.method} ({ours.median_tokens_per_second:.1f})",
                         f"{theirs.method} ({theirs.median_tokens_per_second:.1f})",
                         _x(ours.median_tokens_per_second / theirs.median_tokens_per_second)])
    if not rows:
        return []
    return ["## Against llama.cpp: the fastest method of each (median tok/s)", ""] + _table(
        ["domain", "ours", "llama.cpp's", "ours over llama.cpp's"], rows) + [""]


def _paired_ratios(results: dict, domains: list[str]) -> list[str]:
    """The paired comparisons the results carry (native over dense weights, int8 over float32), one
    table each: the median per prompt of tok/s ratios, per drafter and domain."""
    lines = []
    for key, title, ours, theirs, how in (
            ("native_over_dense", "Native weights over dense float32", "native", "dense",
             f"`specdraft-<drafter>` reads the GGUF's blocks (weights: {results.get('weights', DASH)}), "
             "`specdraft-<drafter>-dense` a float32 copy"),
            ("int8_over_float32", "The int8 arithmetic over float32", "int8", "float32",
             f"`specdraft-<drafter>` computes in {results.get('arithmetic', DASH)}, `specdraft-<drafter>-float32` "
             "in the float32 arithmetic, on the same native weights")):
        if not results.get(key):
            continue
        lines += [f"## {title} (median per prompt of tok/s ratios; medians in brackets)", "",
                  f"{how}; each prompt ran on both back to back.", ""]
        ratios = {(r["domain"], r["drafter"]): r for r in results[key]}
        drafters = list(dict.fromkeys(r["drafter"] for r in results[key]))
        lines += _table(["drafter"] + domains, [
            [name] + [f"{_x(ratios[(d, name)]['median_ratio'])} ({ratios[(d, name)][f'{ours}_tok_s']:.1f} vs "
                      f"{ratios[(d, name)][f'{theirs}_tok_s']:.1f})" if (d, name) in ratios else DASH for d in domains]
            for name in drafters
        ]) + [""]
    return lines


def _domain_tables(summaries: list[CellSummary], domains: list[str]) -> list[str]:
    """One table per domain: every method's figures."""
    header = ["method", "tok/s", "vs none", "vs hf-generate", "vs HF lookup", "acceptance", "mean accepted",
              "per position", "drafting share", "lossless"]
    lines = []
    for domain in domains:
        here = [s for s in summaries if s.domain == domain]
        count = max(s.prompts for s in here)
        lines += [f"## {domain} ({count} prompts)", ""]
        lines += _table(header, [
            [s.method, f"{s.median_tokens_per_second:.1f}", _x(s.speedup_vs_none), _x(s.speedup_vs_hf),
             _x(s.speedup_vs_hf_prompt_lookup), _f(s.acceptance_rate), _f(s.mean_accepted_length),
             _positions(s.per_position_acceptance), _pct(s.drafting_share, 1), _lossless(s)]
            for s in here
        ]) + [""]
    return lines


def render_markdown(results: dict, summaries: list[CellSummary], plots: list[str]) -> str:
    domains = list(dict.fromkeys(s.domain for s in summaries))
    lines = _preamble(results)
    lines += _summary(summaries, domains)
    lines += _decode_summary(summaries, domains)
    lines += _against_llama_cpp(summaries, domains)
    lines += _paired_ratios(results, domains)
    lines += _domain_tables(summaries, domains)
    lines += _by_source(results)
    lines += _step_costs(results)
    lines += _per_prompt(results)
    lines += _divergences(results)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _step_costs(results: dict) -> list[str]:
    """The engine's own step costs at the end of the run (`run.step_costs`), against a plain step."""
    costs = results.get("step_costs")
    if not costs or not costs["sources"]:
        return []
    def ms(value: float | None) -> str:
        return _f(None if value is None else value * 1e3)

    rows = [[f"`{source}`", ms(c.get("draft_token_s")), _f(c.get("draft_token_over_plain_step"), 3),
             ms(c.get("catch_up_token_s")), _f(c.get("catch_up_token_over_plain_step"), 3)]
            for source, c in sorted(costs["sources"].items())]
    return [f"## Step costs the engine measured (a plain step: {costs['plain_step_s'] * 1e3:.2f} ms)", "",
            *_table(["costly source", "a drafted token (ms)", "/ plain step", "a caught-up token (ms)", "/ plain step"],
                    rows), ""]


def _per_prompt(results: dict, method: str = "specdraft-ngram", threshold: float = 0.97) -> list[str]:
    """Per prompt, `method` against our plain decoding: the worst ratios, and the repeats of any prompt
    that looked slower than `threshold` (the median over all its runs tells noise from a loss)."""
    rows = []
    for cell in results["cells"]:
        if cell["method"] != method:
            continue
        plain = {r["id"]: r for c in results["cells"] if c["method"] == BASELINE and c["domain"] == cell["domain"]
                 for r in c["prompts"]}
        for r in cell["prompts"]:
            if r["id"] in plain and plain[r["id"]]["tokens_per_second"]:
                rows.append((cell["domain"], r["id"], r["tokens_per_second"] / plain[r["id"]]["tokens_per_second"]))
    if not rows:
        return []
    rows.sort(key=lambda row: row[2])
    repeats = {(r["domain"], r["id"]): r for r in results.get("repeats", [])}
    below = [row for row in rows if row[2] < threshold]
    lines = [f"## Per prompt: {method} vs {BASELINE}", "",
             f"{len(rows)} prompts; the lowest ratio {rows[0][2]:.2f}, the median {statistics.median(r[2] for r in rows):.2f}; "
             f"{len(below)} below {threshold:.2f} in the main pass. Each of those was run {len(next(iter(repeats.values()))['ratios']) - 1 if repeats else 0} "
             "more times, interleaved; *median* is over all its runs.", ""]
    table = []
    for domain, prompt_id, ratio in rows[: max(5, len(below))]:
        repeat = repeats.get((domain, prompt_id))
        table.append([domain, prompt_id, f"{ratio:.2f}",
                      " ".join(f"{x:.2f}" for x in repeat["ratios"][1:]) if repeat else DASH,
                      f"{repeat['median_ratio']:.2f}" if repeat else DASH])
    return lines + _table(["domain", "prompt", "ratio (main pass)", "repeats", "median"], table) + [""]


def write_report(results: dict, out_dir: Path) -> None:
    """Write results.json (input plus computed summary), results.md and the PNG plots into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize(results)
    plots = []
    if summaries:
        domains = list(dict.fromkeys(s.domain for s in summaries))
        by_key = {(s.domain, s.method): s for s in summaries}
        speedups = {title: {m: [getattr(by_key[(d, m)], attr) if (d, m) in by_key else None for d in domains]
                            for m in method_order([s.method for s in summaries])}
                    for attr, title in (("speedup_vs_none", "vs specdraft-none"), ("speedup_vs_hf", "vs hf-generate"))}
        plot_speedup(domains, speedups, out_dir / "speedup.png")
        plots.append("speedup.png")
    ours = [m for m in method_order([c["method"] for c in results["cells"]]) if not is_peer(m)]
    for method in ours:
        name = f"accepted_length_{method}.png"
        if plot_accepted(results, method, out_dir / name):
            plots.append(name)
    payload = {**results, "summary": [asdict(s) for s in summaries]}
    (out_dir / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out_dir / "results.md").write_text(render_markdown(results, summaries, plots))

