"""How long may a draft be? `ngram` under the cost-aware policy with a longest draft k of 5, 8, 16
and 32, against plain decoding, per domain and source, at batch 1.

One engine per k (each calibrated for its k, as `specdraft serve -k K` would be), all on the same
loaded model; for every prompt, greedy, `none` and `ngram` at every k run one after the other, the
order rotating each round; every output must equal `none`'s. Reported per source: tokens/s (median
over prompts of each prompt's median over rounds), the speed-up over `none`, tokens per target
step, drafted tokens per step, and accepted per drafted token (what verification costs).

    python -m benchmarks.long_drafts [--prompts 6] [--ks 5,8,16,32] [--rounds 2] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from pathlib import Path

from benchmarks.datasets import DOMAINS, load_domain
from benchmarks.report import step_columns, step_stats, write_results
from benchmarks.run import machine
from specdraft.models import load_model
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.runtime import build_runtime, encode_prompt

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts per domain")
    parser.add_argument("--domains", default=",".join(DOMAINS))
    parser.add_argument("--ks", default="5,8,16,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    ks = [int(k) for k in args.ks.split(",")]
    engines = {k: build_runtime(loaded, drafters=["none", "ngram"], k=k, max_batch=1).engine for k in ks}
    configs = [("none", ks[0])] + [("ngram", k) for k in ks]
    params = SamplingParams(max_tokens=args.max_tokens)
    warm = encode_prompt(loaded.tokenizer, "Say hello.")
    for engine in engines.values():
        engine.run([(warm, SamplingParams(max_tokens=8))])
    rows = []
    for domain in [d.strip() for d in args.domains.split(",") if d.strip()]:
        for prompt in load_domain(domain, args.prompts):
            ids = encode_prompt(loaded.tokenizer, prompt.messages)
            runs: dict[str, list[dict]] = {}
            for round_ in range(args.rounds):
                shift = round_ % len(configs)
                for drafter, k in configs[shift:] + configs[:shift]:
                    [done] = engines[k].run([(ids, params, SpeculationParams(drafter))])
                    runs.setdefault(f"{drafter} k={k}" if drafter != "none" else "none", []).append(
                        {"token_ids": done.token_ids, **{key: done.metrics[key] for key in
                         ("tokens_per_second", "steps", "draft_tokens", "accepted_tokens", "seconds")}})
            reference = runs["none"][0]["token_ids"]
            assert all(r["token_ids"] == reference for cell in runs.values() for r in cell), f"{prompt.id}: outputs differ"
            rows.append({"id": prompt.id, "domain": domain, "source": prompt.source, "tokens": len(reference),
                         "runs": {name: [{k: v for k, v in r.items() if k != "token_ids"} for r in cell]
                                  for name, cell in runs.items()}})
            print(f"{prompt.id}: " + ", ".join(f"{name} {statistics.median(r['tokens_per_second'] for r in cell):.1f}"
                                               for name, cell in runs.items()), flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "model": loaded.name, "ks": ks, "rounds": args.rounds, "max_tokens": args.max_tokens,
               "summary": summarize(rows), "prompts": rows}
    write_results(args.out, "long_drafts", results, render(results))


def summarize(rows: list[dict]) -> dict:
    scopes = {}
    for scope in sorted({r["domain"] for r in rows} | {r["source"] for r in rows}):
        chosen = [r for r in rows if scope in (r["domain"], r["source"])]
        cells = {}
        for name in chosen[0]["runs"]:
            tps = [statistics.median(run["tokens_per_second"] for run in r["runs"][name]) for r in chosen]
            ratios = [statistics.median(a["tokens_per_second"] / b["tokens_per_second"]
                                        for a, b in zip(r["runs"][name], r["runs"]["none"])) for r in chosen]
            cells[name] = {"tokens_per_second": statistics.median(tps), "speedup": statistics.median(ratios),
                           **step_stats([r["runs"][name][0] for r in chosen])}
        scopes[scope] = {"prompts": len(chosen), "cells": cells}
    return scopes


def render(results: dict) -> str:
    lines = ["# Long drafts: ngram's longest draft k under the cost-aware policy", "",
             f"Machine: {results['machine']}. Model: {results['model']}. Greedy, {results['max_tokens']} new tokens, "
             f"batch 1; one engine per k, `none` and `ngram` at every k interleaved per prompt over {results['rounds']} "
             "rounds; every output equals `none`'s. tok/s: median over prompts; speed-up: median over prompts of the "
             "per-round ratio to `none`; tokens/step: emitted tokens per target step; drafted/step and accepted per "
             "drafted token: what verification costs. Run with `python -m benchmarks.long_drafts`.", "",
             "| scope | prompts | config | tok/s | speed-up | tokens/step | drafted/step | accepted/drafted |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for scope, s in results["summary"].items():
        for name, c in s["cells"].items():
            lines.append(f"| {scope} | {s['prompts']} | {name} | {c['tokens_per_second']:.1f} | {c['speedup']:.2f}x | "
                         f"{step_columns(c)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
