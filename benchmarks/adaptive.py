"""Does the `ngram` drafter's adaptive draft length pay? Throughput of the same prompts, greedy, at
several batch sizes (continuous batching), for plain decoding, `ngram` with drafts always up to k
(fixed), `ngram` with the adaptive rule on at every batch size (adaptive: the shipped default,
`adapt_from_batch` = 1), and the first, scanning prompt lookup (always up to k). Also the mean
accepted draft tokens per step by domain, which compares the drafters' proposals: `fixed` against
the scan is like for like (both draft up to k whenever they can).
Methods run interleaved, repeated; the median over repeats is reported.

    python -m benchmarks.adaptive [--prompts 16] [--max-tokens 96] [--batches 1,4,8,16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.datasets import DOMAINS, load_domain
from benchmarks.run import machine
from specdraft.drafters import create_drafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.engine import Engine
from specdraft.models import load_model
from specdraft.runtime import encode_prompt
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier

RESULTS = Path(__file__).parent / "results"


def drafters(k: int, eos: tuple[int, ...]) -> dict:
    return {
        "none": lambda: create_drafter("none"),
        "ngram-fixed": lambda: NgramDrafter(k=k, eos_token_ids=eos, adaptive=False),
        "ngram-adaptive": lambda: NgramDrafter(k=k, eos_token_ids=eos, adaptive=True, adapt_from_batch=1),
        "prompt-lookup-scan": lambda: create_drafter("prompt-lookup-scan", k=k),
    }


def run_once(loaded, drafter, prompts: list[list[int]], k: int, batch: int, max_tokens: int,
             domains: list[str] | None = None) -> dict:
    engine = Engine(Verifier(loaded.model), drafter, loaded.tokenizer, loaded.eos_token_ids, loaded.max_context,
                    k=k, max_batch=batch)
    start = time.perf_counter()
    done = engine.run([(p, SamplingParams(max_tokens=max_tokens)) for p in prompts])
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for c in done)
    steps = sum(c.metrics["steps"] for c in done)
    by_domain: dict[str, list[int]] = {}
    for domain, c in zip(domains or [], done):
        totals = by_domain.setdefault(domain, [0, 0])
        totals[0] += c.metrics["accepted_tokens"]
        totals[1] += c.metrics["steps"]
    return {
        "accepted_per_step_by_domain": {d: a / s if s else 0.0 for d, (a, s) in by_domain.items()},
        "tokens_per_second": tokens / seconds,
        "draft_tokens": sum(c.metrics["draft_tokens"] for c in done),
        "accepted_tokens": sum(c.metrics["accepted_tokens"] for c in done),
        "steps": steps,
        "outputs": [c.token_ids for c in done],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Adaptive vs fixed draft length for the ngram drafter")
    parser.add_argument("--prompts", type=int, default=16, help="prompts in all, spread over the domains")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("-k", "--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    per_domain = -(-args.prompts // len(DOMAINS))
    prompts = [p for d in DOMAINS for p in load_domain(d, per_domain)][: args.prompts]
    domains = [p.domain for p in prompts]
    ids = [encode_prompt(loaded.tokenizer, p.messages) for p in prompts]
    batches = [int(b) for b in args.batches.split(",")]
    makers = drafters(args.k, loaded.eos_token_ids)
    run_once(loaded, makers["ngram-fixed"](), ids[:2], args.k, 2, 8)  # warm-up

    samples: dict[tuple[int, str], list[dict]] = {}
    with tqdm(total=args.repeats * len(batches) * len(makers), desc="adaptive", unit="run") as bar:
        for _ in range(args.repeats):
            for batch in batches:
                for name, make in makers.items():
                    bar.set_postfix_str(f"batch {batch} {name}")
                    samples.setdefault((batch, name), []).append(run_once(loaded, make(), ids, args.k, batch, args.max_tokens, domains))
                    bar.update()

    cells = []
    for (batch, name), runs in samples.items():
        reference = samples[(batch, "none")][0]["outputs"]
        cells.append({
            "batch": batch,
            "method": name,
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
            "runs_tokens_per_second": [r["tokens_per_second"] for r in runs],
            "acceptance_rate": runs[0]["accepted_tokens"] / runs[0]["draft_tokens"] if runs[0]["draft_tokens"] else None,
            "mean_accepted_per_step": runs[0]["accepted_tokens"] / runs[0]["steps"],
            "draft_tokens_per_step": runs[0]["draft_tokens"] / runs[0]["steps"],
            "identical_to_none": all(r["outputs"] == reference for r in runs),
            "accepted_per_step_by_domain": runs[0]["accepted_per_step_by_domain"],
        })
    result = {"machine": machine(), "model": loaded.name, "k": args.k, "max_tokens": args.max_tokens,
              "prompts": [p.id for p in prompts], "repeats": args.repeats, "cells": cells}
    write(result, args.out)
    print((args.out / "adaptive.md").read_text())


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "adaptive.json").write_text(json.dumps(result, indent=1) + "\n")
    by = {(c["batch"], c["method"]): c for c in result["cells"]}
    batches = sorted({c["batch"] for c in result["cells"]})
    lines = [
        "# Adaptive draft length of the `ngram` drafter",
        "",
        f"Machine: {result['machine']}. Model: {result['model']}. {len(result['prompts'])} prompts "
        f"(code, JSON, prose), greedy, {result['max_tokens']} new tokens each, k = {result['k']}; all prompts "
        f"decoded with continuous batching at each batch size; median of {result['repeats']} interleaved runs.",
        "Run with `python -m benchmarks.adaptive`.",
        "",
        "| batch | none tok/s | scan tok/s (x none) | fixed tok/s (x none) | adaptive tok/s (x none) | adaptive / fixed | "
        "draft tokens per step fixed / adaptive | accepted per step fixed / adaptive | outputs identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in batches:
        none, fixed, adaptive = by[b, "none"], by[b, "ngram-fixed"], by[b, "ngram-adaptive"]
        scan = by[b, "prompt-lookup-scan"]
        same = all(c["identical_to_none"] for c in (fixed, adaptive, scan))
        lines.append(
            f"| {b} | {none['tokens_per_second']:.1f} | {scan['tokens_per_second']:.1f} "
            f"({scan['tokens_per_second'] / none['tokens_per_second']:.2f}x) | {fixed['tokens_per_second']:.1f} "
            f"({fixed['tokens_per_second'] / none['tokens_per_second']:.2f}x) | {adaptive['tokens_per_second']:.1f} "
            f"({adaptive['tokens_per_second'] / none['tokens_per_second']:.2f}x) | "
            f"{adaptive['tokens_per_second'] / fixed['tokens_per_second']:.2f}x | "
            f"{fixed['draft_tokens_per_step']:.2f} / {adaptive['draft_tokens_per_step']:.2f} | "
            f"{fixed['mean_accepted_per_step']:.2f} / {adaptive['mean_accepted_per_step']:.2f} | {'yes' if same else 'NO'} |"
        )
    lines += [
        "",
        f"Mean accepted draft tokens per step by domain, batch {batches[0]} (each step also yields one target token):",
        "",
        "| domain | prompt-lookup-scan (first version) | ngram fixed | ngram adaptive |",
        "| --- | --- | --- | --- |",
    ]
    for domain in by[batches[0], "none"]["accepted_per_step_by_domain"]:
        values = [by[batches[0], m]["accepted_per_step_by_domain"][domain]
                  for m in ("prompt-lookup-scan", "ngram-fixed", "ngram-adaptive")]
        lines.append(f"| {domain} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    (out / "adaptive.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
