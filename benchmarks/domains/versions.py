"""Two versions of the code on the per-domain prompts: does a change keep every output, and its speed?

`record` runs under one checkout (`PYTHONPATH=<checkout>`): each prompt of each domain, greedy, one
request at a time, with each drafter, through `specdraft.LLM`'s chat on the embedded model; it writes
every output's token ids and wall seconds. Run it alternately under the two checkouts (before, after,
before, after ...: slow drift of the machine hits both alike), then `compare` the files:

    PYTHONPATH=<before> python -m benchmarks.domains.versions record /tmp/ab/before_1.json
    PYTHONPATH=<after>  python -m benchmarks.domains.versions record /tmp/ab/after_1.json
    ...
    python -m benchmarks.domains.versions compare --before /tmp/ab/before_*.json --after /tmp/ab/after_*.json --out DIR

`record --model M --draft-model D` runs a pair instead (the `model` drafter too). `record` imports only
what both sides have (`LLM`, `SamplingParams`, `SpeculationParams` and the prompt sets, found under
their old or new module name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

DOMAINS = ("code", "json", "prose")
DRAFTERS = ("none", "ngram", "hybrid")


def record(out: Path, prompts: int, max_tokens: int, model: str | None = None, draft_model: str | None = None) -> None:
    try:
        from benchmarks.domains.datasets import load_domain
    except ImportError:  # a checkout from before the benchmarks were grouped
        from benchmarks.datasets import load_domain
    from specdraft import LLM, SamplingParams, SpeculationParams

    drafters = [*DRAFTERS, *(["model"] if draft_model else [])]
    llm = LLM(model, drafters=drafters, **({"draft_model": draft_model} if draft_model else {}))
    rows = {}
    for domain in DOMAINS:
        for prompt in load_domain(domain, prompts):
            for name in drafters:
                start = time.perf_counter()
                [done] = llm.chat([prompt.messages], SamplingParams(temperature=0, max_tokens=max_tokens),
                                  SpeculationParams(name))
                rows[f"{domain}/{prompt.id}/{name}"] = {"ids": list(done.token_ids), "seconds": time.perf_counter() - start}
    out.write_text(json.dumps(rows))


def compare(before: list[dict], after: list[dict]) -> dict:
    """Whether every output is the same in every run of both versions (and equal to `none`'s), and per
    domain and drafter the median over prompts of each version's tokens per second (a prompt's median
    over runs) and of the prompt's time after over before."""
    keys = sorted(before[0])
    first = before[0]
    equal = sum(all(run[k]["ids"] == first[k]["ids"] for run in before + after) for k in keys)
    lossless = sum(first[k]["ids"] == first[k.rsplit("/", 1)[0] + "/none"]["ids"] for k in keys)
    cells = {}
    for domain in DOMAINS:
        for name in dict.fromkeys(k.rsplit("/", 1)[1] for k in keys):
            ks = [k for k in keys if k.startswith(f"{domain}/") and k.endswith(f"/{name}")]
            speed = {side: statistics.median(statistics.median(len(r[k]["ids"]) / r[k]["seconds"] for r in runs)
                                             for k in ks) for side, runs in (("before", before), ("after", after))}
            time_ratio = statistics.median(statistics.median(r[k]["seconds"] for r in after)
                                           / statistics.median(r[k]["seconds"] for r in before) for k in ks)
            cells[f"{domain}/{name}"] = {**{f"{side}_tok_s": v for side, v in speed.items()}, "time_after_over_before": time_ratio}
    return {"outputs": len(keys), "equal_in_every_run": equal, "equal_to_none": lossless, "runs": len(before),
            "runs_after": len(after), "cells": cells}


def report(result: dict) -> str:
    lines = [f"Outputs the same in every run of both versions: {result['equal_in_every_run']}/{result['outputs']}; "
             f"each equal to `none`'s: {result['equal_to_none']}/{result['outputs']}. {result['runs']} runs before, "
             f"{result.get('runs_after', result['runs'])} after, alternated; medians over prompts of each prompt's "
             "median over runs.", "",
             "| domain | drafter | before (tok/s) | after (tok/s) | time, after / before |", "| --- | --- | --- | --- | --- |"]
    for cell, f in result["cells"].items():
        domain, name = cell.split("/")
        lines.append(f"| {domain} | {name} | {f['before_tok_s']:.1f} | {f['after_tok_s']:.1f} | "
                     f"{f['time_after_over_before']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--prompts", type=int, default=6)
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--model", default=None, help="the target (default: the embedded model)")
    rec.add_argument("--draft-model", default=None, help="a draft model: the `model` drafter runs too")
    cmp = sub.add_parser("compare")
    cmp.add_argument("--before", type=Path, nargs="+", required=True)
    cmp.add_argument("--after", type=Path, nargs="+", required=True)
    cmp.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.prompts, args.max_tokens, args.model, args.draft_model)
        return
    result = compare(*([json.loads(p.read_text()) for p in paths] for paths in (args.before, args.after)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "versions.json").write_text(json.dumps(result, indent=1))
    (args.out / "versions.md").write_text(report(result) + "\n")
    print(report(result))


if __name__ == "__main__":
    main()
