"""Runs of the per-domain benchmark side by side: did a change move any figure beyond the spread
between runs of the same code? Each run is a `results.json` (`benchmarks.domains.run`) under a label; runs of
one code share a group. Per domain and method: median tok/s and the speed-up over `none` of every
run, each group's range, and the shift of the later group's median against the earlier's range.

    python -m benchmarks.domains.compare --group before run1/results.json run2/results.json \\
        --group after run3/results.json run4/results.json --out DIR --name compare
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.common import RESULTS, cli, write_results
from benchmarks.domains.names import method_order
from benchmarks.domains.report import summarize


def figures(results: dict) -> dict[tuple[str, str], dict]:
    """(domain, method) -> median tok/s, speed-up over none and lossless count of one run."""
    return {(s.domain, s.method): {"tokens_per_second": s.median_tokens_per_second, "speedup": s.speedup_vs_none,
                                   "lossless": f"{s.lossless_count}/{s.lossless_known}"}
            for s in summarize(results)}


def compare(groups: dict[str, list[dict]]) -> dict:
    """Every run's figures by group, and per (domain, method) each group's range of speed-ups."""
    runs = {name: [figures(r) for r in results] for name, results in groups.items()}
    seen = list(dict.fromkeys(cell for group in runs.values() for run in group for cell in run))
    domains, methods = list(dict.fromkeys(d for d, _ in seen)), method_order([m for _, m in seen])
    cells = sorted(set(seen), key=lambda c: (domains.index(c[0]), methods.index(c[1])))
    rows = []
    for domain, method in cells:
        row = {"domain": domain, "method": method, "groups": {}}
        for name, group in runs.items():
            found = [run[(domain, method)] for run in group if (domain, method) in run]
            speedups = [f["speedup"] for f in found if f["speedup"] is not None]
            row["groups"][name] = {"runs": found, "median_speedup": statistics.median(speedups) if speedups else None,
                                   "speedup_range": [min(speedups), max(speedups)] if speedups else None}
        rows.append(row)
    return {"groups": {name: len(group) for name, group in runs.items()}, "cells": rows}


def render(result: dict, title: str) -> str:
    names = list(result["groups"])
    header = (["domain", "method"] + [f"{n}: tok/s (x none) per run" for n in names]
              + [f"{n}: median x none" for n in names] + ["lossless"])
    lines = [f"# {title}", "",
             "Per-domain benchmark runs (`python -m benchmarks.domains.run`), side by side: each run's median tok/s "
             "over prompts with its speed-up over `none` of the same run; lossless: prompts whose output "
             "equals Hugging Face `generate`'s, per run. Made with `python -m benchmarks.domains.compare`.", "",
             "| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for row in result["cells"]:
        cells = [row["domain"], row["method"]]
        for name in names:
            runs = [f"{f['tokens_per_second']:.1f}" + (f" ({f['speedup']:.2f}x)" if f["speedup"] is not None else "")
                    for f in row["groups"][name]["runs"]]
            cells.append(" / ".join(runs) or "-")
        for name in names:
            median = row["groups"][name]["median_speedup"]
            cells.append("-" if median is None else f"{median:.2f}x")
        cells.append("; ".join(f"{n}: {' '.join(f['lossless'] for f in row['groups'][n]['runs'])}" for n in names))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = cli(__doc__, RESULTS / "domains")
    parser.add_argument("--group", nargs="+", action="append", required=True, metavar=("NAME", "RESULTS_JSON"),
                        help="a group's name, then its runs' results.json files")
    parser.add_argument("--title", default="Per-domain runs compared")
    parser.add_argument("--name", default="compare")
    args = parser.parse_args()
    groups = {name: [json.loads(Path(p).read_text()) for p in paths] for name, *paths in args.group}
    result = compare(groups)
    write_results(args.out, args.name, result, render(result, args.title))


if __name__ == "__main__":
    main()
