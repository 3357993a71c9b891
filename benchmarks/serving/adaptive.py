"""Does speculation pay at every batch size? Throughput of the same prompts, greedy, with continuous
batching at batch 1, 4, 8, 16, for plain batched decoding (`none`) and for drafters under the
engine's cost-aware draft length (`specdraft.policy`), against the same drafters always drafting up
to k (`fixed`, what the engine did before the policy). Methods run interleaved, repeated; the median
over repeats is reported. Every output is checked against plain decoding's.

At batch B the engine gets max(--min-prompts, --per-slot * B) prompts (code, JSON, prose in turn),
so that it runs full for most of the run. The headline is the decode throughput at full batch
(tokens / time of the steps that decoded B rows, less the time those steps spent prefilling the
target with a new request's prompt: the same work whatever drafts, but plain decoding of
equal-length requests admits a whole wave at once, in steps that are not full, while speculation
finishes requests at different times and admits each in a full step). The throughput over the
whole run (makespan: prefill, and the drain at the end, where the last requests run in a smaller
batch) is reported beside it.

    python -m benchmarks.serving.adaptive [--per-slot 2] [--max-tokens 64] [--batches 1,4,8,16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain
from specdraft.engine import Engine
from specdraft.models import load_model
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.runtime import build_runtime, encode_prompt
from specdraft.settings import Settings


def run_once(engine: Engine, drafter: str, prompts: list[list[int]], max_tokens: int, domains: list[str]) -> dict:
    """Decode `prompts` with continuous batching. Two throughputs: over the whole run (`makespan`:
    all tokens / wall time, which includes prefill and the drain at the end, when the last requests
    run in a batch smaller than the engine's), and decoding at full batch (tokens / time of the
    steps that decoded max_batch rows, less their prefill: the decode throughput *at this batch size*)."""
    ids = [engine.submit(p, SamplingParams(max_tokens=max_tokens), SpeculationParams(drafter)) for p in prompts]
    full_tokens = full_seconds = full_steps = 0
    start = time.perf_counter()
    while engine.has_work:
        step_start, prefill_before = time.perf_counter(), engine.prefill_seconds
        deltas = engine.step()
        rows = len({d.request_id for d in deltas if d.token_ids})
        if rows == engine.max_batch:
            full_seconds += time.perf_counter() - step_start - (engine.prefill_seconds - prefill_before)
            full_tokens += sum(len(d.token_ids) for d in deltas)
            full_steps += 1
    seconds = time.perf_counter() - start
    done = [engine.collect(i) for i in ids]
    steps = sum(c.metrics.steps for c in done)
    by_domain: dict[str, list[int]] = {}
    for domain, c in zip(domains, done):
        totals = by_domain.setdefault(domain, [0, 0])
        totals[0] += c.metrics.accepted_tokens
        totals[1] += c.metrics.steps
    return {
        "tokens_per_second": full_tokens / full_seconds if full_seconds else None,
        "makespan_tokens_per_second": sum(len(c.token_ids) for c in done) / seconds,
        "full_batch_steps": full_steps,
        "full_batch_seconds": full_seconds,
        "seconds": seconds,
        "draft_tokens": sum(c.metrics.draft_tokens for c in done),
        "accepted_tokens": sum(c.metrics.accepted_tokens for c in done),
        "steps": steps,
        "accepted_per_step_by_domain": {d: a / s if s else 0.0 for d, (a, s) in by_domain.items()},
        "outputs": [c.token_ids for c in done],
    }


def arguments() -> argparse.Namespace:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--per-slot", type=int, default=2, help="prompts per batch slot")
    parser.add_argument("--min-prompts", type=int, default=8, help="prompts at least, at any batch size")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drafters", default="ngram,hybrid", help="drafters to run with the policy")
    parser.add_argument("--fixed", default="ngram,hybrid", help="drafters to run also drafting up to k every step")
    parser.add_argument("-k", "--k", type=int, default=5)
    return parser.parse_args()


def load_prompts(loaded, count: int) -> tuple[list, list[str], list[list[int]]]:
    """At least `count` prompts, code, JSON and prose in turn: the prompts, their domains and their token ids."""
    per_domain = -(-count // len(DOMAINS))
    by_domain = [load_domain(d, per_domain) for d in DOMAINS]
    prompts = [p for group in zip(*by_domain) for p in group]  # code, JSON, prose in turn
    domains = [p.domain for p in prompts]
    ids = [encode_prompt(loaded.tokenizer, p.messages) for p in prompts]
    return prompts, domains, ids


def build_engines(loaded, drafters: dict[str, list[str]], k: int, batches: list[int]) -> dict[str, dict[int, Engine]]:
    """Per policy with drafters and batch size, an engine over the same model, each learning its own
    costs: the cost-aware policy ("auto"), and always drafting up to k ("fixed")."""
    return {policy: {b: build_runtime(loaded, Settings(drafters=drafters[policy], k=k, max_batch=b, policy=policy,
                                                       prefix_cache_mb=0)).engine
                     for b in batches}
            for policy in ("auto", "fixed") if drafters[policy]}


def sample(engines: dict, methods: list[tuple[str, str, str]], batches: list[int], needed: dict[int, int],
           ids: list[list[int]], domains: list[str], max_tokens: int, repeats: int) -> dict[tuple[int, str], list[dict]]:
    """(batch, method) -> `run_once`'s result for each repeat, the methods interleaved, after a warm-up
    of every engine (first calls pay one-off costs; the policy's engines learn this machine's costs)."""
    for b in batches:
        for _, policy, drafter in methods:
            run_once(engines[policy][b], drafter, ids[:2], 16, domains[:2])
    samples: dict[tuple[int, str], list[dict]] = {}
    with tqdm(total=repeats * len(batches) * len(methods), desc="adaptive", unit="run") as bar:
        for _ in range(repeats):
            for b in batches:
                for method, policy, drafter in methods:
                    bar.set_postfix_str(f"batch {b} {method}")
                    samples.setdefault((b, method), []).append(
                        run_once(engines[policy][b], drafter, ids[: needed[b]], max_tokens, domains[: needed[b]]))
                    bar.update()
    return samples


def summarise(samples: dict[tuple[int, str], list[dict]], needed: dict[int, int]) -> list[dict]:
    """One cell per (batch, method): medians over its runs, and whether every output equals `none`'s."""
    cells = []
    for (batch, method), runs in samples.items():
        reference = samples[(batch, "none")][0]["outputs"]
        cells.append({
            "batch": batch,
            "method": method,
            "prompts": needed[batch],
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "runs_tokens_per_second": [r["tokens_per_second"] for r in runs],
            "makespan_tokens_per_second": statistics.median(r["makespan_tokens_per_second"] for r in runs),
            "runs_makespan_tokens_per_second": [r["makespan_tokens_per_second"] for r in runs],
            "full_batch_share": statistics.median(r["full_batch_seconds"] / r["seconds"] for r in runs),
            "acceptance_rate": runs[0]["accepted_tokens"] / runs[0]["draft_tokens"] if runs[0]["draft_tokens"] else None,
            "mean_accepted_per_step": runs[0]["accepted_tokens"] / runs[0]["steps"],
            "draft_tokens_per_step": runs[0]["draft_tokens"] / runs[0]["steps"],
            "identical_to_none": all(r["outputs"] == reference for r in runs),
            "accepted_per_step_by_domain": runs[0]["accepted_per_step_by_domain"],
        })
    return cells


def main() -> None:
    args = arguments()
    loaded = load_model(None, device=None, dtype="auto")
    batches = [int(b) for b in args.batches.split(",")]
    needed = {b: max(args.min_prompts, args.per_slot * b) for b in batches}
    prompts, domains, ids = load_prompts(loaded, max(needed.values()))
    names = [n.strip() for n in args.drafters.split(",") if n.strip()]
    fixed = [n.strip() for n in args.fixed.split(",") if n.strip()]
    engines = build_engines(loaded, {"auto": ["none", *names], "fixed": fixed}, args.k, batches)
    methods = [("none", "auto", "none")] + [(f"{n}", "auto", n) for n in names] + [(f"{n}-fixed", "fixed", n) for n in fixed]
    samples = sample(engines, methods, batches, needed, ids, domains, args.max_tokens, args.repeats)
    cells = summarise(samples, needed)
    result = {"machine": machine(), "model": loaded.name, "k": args.k, "max_tokens": args.max_tokens,
              "prompts": [p.id for p in prompts[: max(needed.values())]], "repeats": args.repeats, "drafters": names, "fixed": fixed,
              "per_slot": args.per_slot, "min_prompts": args.min_prompts, "cells": cells}
    write(result, args.out)
    print((args.out / "adaptive.md").read_text())


def write(result: dict, out: Path) -> None:
    by = {(c["batch"], c["method"]): c for c in result["cells"]}
    batches = sorted({c["batch"] for c in result["cells"]})
    names, fixed = result["drafters"], result.get("fixed", result["drafters"])
    methods = [m for n in names for m in (n, f"{n}-fixed") if m == n or n in fixed]
    lines = [
        "# Speculation at every batch size: the cost-aware draft length",
        "",
        f"Machine: {result['machine']}. Model: {result['model']}. Greedy, {result['max_tokens']} new tokens a prompt, "
        f"k = {result['k']}; at batch B, max({result['min_prompts']}, {result['per_slot']}B) prompts (code, JSON, prose in turn) decoded with continuous "
        f"batching; median of {result['repeats']} interleaved runs. `none` is plain batched decoding; a drafter's "
        "name alone is the engine's default (the cost-aware policy picks each step's draft length from measured costs "
        "and acceptance), `-fixed` drafts up to k every step. Run with `python -m benchmarks.serving.adaptive`.",
        "",
        "Each cell: decode tok/s at full batch (the steps that decoded B rows, less the time they spent prefilling "
        "a new request's prompt: the same work whatever drafts, but plain decoding of equal-length requests admits "
        "each wave in steps that are not full, while speculation finishes requests at different times and admits "
        "them in full steps) with its ratio to `none`, then the same over the whole run (makespan: also prefill, and "
        "the drain at the end, where the last requests run alone or in a smaller batch).",
        "",
    ]
    header = ["batch", "prompts", "none tok/s (full / makespan)"]
    header += [f"{m} (x none)" for m in methods]
    header += ["draft tokens per step (policy / fixed)", "outputs identical to none"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for b in batches:
        none = by[b, "none"]
        row = [str(b), str(none.get("prompts", "")),
               f"{none['tokens_per_second']:.1f} / {none['makespan_tokens_per_second']:.1f}"]
        for m in methods:
            c = by[b, m]
            row.append(f"{c['tokens_per_second']:.1f} ({c['tokens_per_second'] / none['tokens_per_second']:.2f}x) / "
                       f"{c['makespan_tokens_per_second']:.1f} "
                       f"({c['makespan_tokens_per_second'] / none['makespan_tokens_per_second']:.2f}x)")
        row.append(", ".join(f"{n}: {by[b, n]['draft_tokens_per_step']:.2f}"
                             + (f" / {by[b, n + '-fixed']['draft_tokens_per_step']:.2f}" if n in fixed else "")
                             for n in names))
        same = all(c["identical_to_none"] for (bb, _), c in by.items() if bb == b)
        row.append("yes" if same else "NO")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Runs per cell, in order (decode tok/s at full batch, then makespan):", ""]
    for b in batches:
        lines.append(f"- batch {b}: " + "; ".join(
            f"{m} {' / '.join(f'{x:.1f}' for x in by[b, m]['runs_tokens_per_second'])} "
            f"(makespan {' / '.join(f'{x:.1f}' for x in by[b, m]['runs_makespan_tokens_per_second'])})"
            for m in ["none", *methods]))
    write_results(out, "adaptive", result, "\n".join(lines))


if __name__ == "__main__":
    main()
