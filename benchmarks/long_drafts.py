"""How long may a draft be? `ngram` under the cost-aware policy with a longest draft k of 5, 8, 16
and 32, against plain decoding, per domain and source, at batch 1.

One engine per k (each calibrated for its k, as `specdraft serve -k K` would be), all on the same
loaded model; for every prompt, greedy, `none` and `ngram` at every k (and `--methods`, at the first
k: `hybrid`, `ngram+memory`, the Hugging Face peers) run one after the other, the order rotating each
round; each output is compared with `none`'s. Reported per source: tokens/s (median over prompts of
each prompt's median over rounds), the speed-up over `none`, tokens per target step, drafted tokens
per step, and accepted per drafted token (what verification costs), and what an oracle copy drafter
could reach on the same outputs (`benchmarks.ceiling`).

    python -m benchmarks.long_drafts [--prompts 6] [--ks 5,8,16,32] [--rounds 2] [--max-tokens 128]
    python -m benchmarks.long_drafts --domains code --prompts 8 --ks 5,16 \
        --methods hybrid,ngram+memory,hf-generate,hf-prompt-lookup-k10 --name long_drafts_code
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from pathlib import Path

from benchmarks.ceiling import UNBOUNDED, copy_ceiling
from benchmarks.common import RESULTS, machine, write_results
from benchmarks.datasets import DOMAINS, load_domain
from benchmarks.methods import OURS, PEERS, Methods
from benchmarks.report import bar_plot, step_columns, step_stats
from specdraft.models import load_model
from specdraft.runtime import encode_prompt

EXTRAS = tuple(n for n in OURS + PEERS if n not in ("none", "ngram"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts per domain")
    parser.add_argument("--domains", default=",".join(DOMAINS))
    parser.add_argument("--ks", default="5,8,16,32")
    parser.add_argument("--methods", default="", help=f"also run these at the first k (of {', '.join(EXTRAS)})")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="long_drafts", help="report file name (NAME.json, NAME.md)")
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    ks = [int(k) for k in args.ks.split(",")]
    extras = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if set(extras) - set(EXTRAS):
        parser.error(f"--methods: unknown {', '.join(sorted(set(extras) - set(EXTRAS)))}; choose from {', '.join(EXTRAS)}")
    methods = Methods(loaded, ("none", *extras), k=ks[0], max_tokens=args.max_tokens, long_ks=tuple(ks))
    ceiling_ks = sorted({*ks, 5, UNBOUNDED})
    rows = []
    for domain in [d.strip() for d in args.domains.split(",") if d.strip()]:
        for prompt in load_domain(domain, args.prompts):
            ids = encode_prompt(loaded.tokenizer, prompt.messages)
            memory = methods.memory_state()  # each round's memory as before the prompt
            names = list(methods.names)
            runs: dict[str, list[dict]] = {}
            for round_ in range(args.rounds):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    runs.setdefault(name, []).append(methods.run(name, ids, memory))
            reference = runs["none"][0]["token_ids"]
            equal = {name: all(r["token_ids"] == reference for r in cell) for name, cell in runs.items()}
            if not all(equal.values()):
                print(f"{prompt.id}: outputs differ from none's: {[n for n, e in equal.items() if not e]}", flush=True)
            rows.append({"id": prompt.id, "domain": domain, "source": prompt.source, "tokens": len(reference),
                         "equal_to_none": equal,
                         "copy_ceiling": {str(k): copy_ceiling(ids, reference, k) for k in ceiling_ks},
                         "runs": {name: [{k: v for k, v in r.items() if k != "token_ids"} for r in cell]
                                  for name, cell in runs.items()}})
            print(f"{prompt.id}: " + ", ".join(f"{name} {statistics.median(r['tokens_per_second'] for r in cell):.1f}"
                                               for name, cell in runs.items()), flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "model": loaded.name, "ks": ks, "rounds": args.rounds, "max_tokens": args.max_tokens,
               "summary": summarize(rows), "prompts": rows}
    write_results(args.out, args.name, results, render(results))
    plot(results, args.out / f"{args.name}.png")


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
                           "equal_to_none": sum(r["equal_to_none"][name] for r in chosen)}
            if "steps" in chosen[0]["runs"][name][0]:
                cells[name].update(step_stats([r["runs"][name][0] for r in chosen]))
        ceiling = {k: statistics.median(r["copy_ceiling"][k] for r in chosen) for k in chosen[0]["copy_ceiling"]}
        scopes[scope] = {"prompts": len(chosen), "cells": cells, "copy_ceiling": ceiling}
    return scopes


def _k_label(k: str) -> str:
    return "unbounded" if int(k) >= UNBOUNDED else f"k = {k}"


def render(results: dict) -> str:
    lines = ["# Long drafts: ngram's longest draft k under the cost-aware policy", "",
             f"Machine: {results['machine']}. Model: {results['model']}. Greedy, {results['max_tokens']} new tokens, "
             f"batch 1; one engine per k; every method interleaved per prompt over {results['rounds']} rounds, the order "
             "rotating; equal: prompts whose output equals `none`'s in every round (`none`'s equals Hugging Face "
             "`generate`'s where `hf-generate` ran). Methods other than `ngram k=K` run at the first k. tok/s: median "
             "over prompts; speed-up: median over prompts of the per-round ratio to `none`; tokens/step: emitted tokens "
             "per target step; drafted/step and accepted per drafted token: what verification costs. Run with "
             "`python -m benchmarks.long_drafts`.", "",
             "| scope | prompts | config | tok/s | speed-up | tokens/step | drafted/step | accepted/drafted | equal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for scope, s in results["summary"].items():
        for name, c in s["cells"].items():
            per_step = step_columns(c) if "tokens_per_step" in c else "- | - | -"
            lines.append(f"| {scope} | {s['prompts']} | {name} | {c['tokens_per_second']:.1f} | {c['speedup']:.2f}x | "
                         f"{per_step} | {c['equal_to_none']}/{s['prompts']} |")
    ks = list(next(iter(results["summary"].values()))["copy_ceiling"])
    lines += ["", "What copying could reach on these outputs (`benchmarks/ceiling.py`): tokens per target step of an "
              "oracle that drafts, after any earlier occurrence of the last token, the continuation agreeing longest "
              "with the output, all of it accepted; median over prompts. A bound on `ngram`'s tokens/step at that k.",
              "", "| scope | " + " | ".join(_k_label(k) for k in ks) + " |", "| --- |" + " --- |" * len(ks)]
    lines += [f"| {scope} | " + " | ".join(f"{s['copy_ceiling'][k]:.2f}" for k in ks) + " |"
              for scope, s in results["summary"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Speed-up over `none` per source (domains left out), one bar per configuration."""
    summary = results["summary"]
    domains = {r["domain"] for r in results["prompts"]}
    scopes = [s for s in summary if s not in domains] or list(summary)
    names = [n for n in summary[scopes[0]]["cells"] if n != "none"]
    bar_plot(path, scopes, {n: [summary[s]["cells"][n]["speedup"] for s in scopes] for n in names},
             "speed-up over none (median tok/s ratio)", f"Long drafts, batch 1, {results['max_tokens']} tokens")


if __name__ == "__main__":
    main()
