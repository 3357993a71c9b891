"""Structured output: the JSON domain with and without a JSON Schema per prompt.

Each JSON prompt comes with its answer's schema (BFCL: the function call, `{"name": ..., "arguments":
{...}}` with the function's parameters; extraction: an array of records with the asked keys). For
every prompt, greedy, one request at a time, in one run and interleaved (the order rotates each
round): `none` and `ngram`, each free and constrained to the schema (`response_format` json_schema).
Reported per source and over the domain: tokens/s (median over prompts of each prompt's median over
rounds) and the speed-up of `ngram` over `none` in each mode; tokens per target step; the share of
output tokens the grammar forced (the constrained output replayed through the grammar: tokens equal
to its forced continuation); forced draft tokens accepted; the grammar's time per step (masks,
cutting drafts, forced tokens, advancing) and its share of the request; and validity (the output
parses and validates against the schema). Greedy outputs of `ngram` must equal `none`'s in each mode.

    python -m benchmarks.serving.structured [--prompts 8] [--max-tokens 128] [--rounds 3] [-k 5]
"""

from __future__ import annotations

import datetime as dt
import json
import statistics

import jsonschema

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.domains.datasets import load_domain
from specdraft import LLM, ResponseFormat, SamplingParams, SpeculationParams
from specdraft.engine import GrammarMetrics
from specdraft.grammar import GrammarCompiler
from specdraft.models import load_model
from specdraft.runtime import encode_prompt

CONFIGS = (("none", False), ("ngram", False), ("none", True), ("ngram", True))


def label(drafter: str, constrained: bool) -> str:
    return f"{drafter} {'schema' if constrained else 'free'}"


def valid(text: str, schema: dict) -> tuple[bool, bool]:
    """(parses as JSON, validates against the schema)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False, False
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return True, False
    return True, True


def forced_tokens(compiler: GrammarCompiler, response_format: ResponseFormat, tokens: list[int]) -> int:
    """Output tokens the grammar forced: replayed from the start, the tokens at each point that equal
    the grammar's forced continuation there."""
    grammar, forced, i = compiler.matcher(response_format), 0, 0
    while i < len(tokens):
        ahead = grammar.forced([], len(tokens) - i)
        same = next((j for j, (a, b) in enumerate(zip(ahead, tokens[i:])) if a != b), min(len(ahead), len(tokens) - i))
        forced += same
        step = max(same, 1)
        grammar.advance(tokens[i : i + step])
        i += step
    return forced


def run_one(llm: LLM, ids: list[int], drafter: str, response_format: ResponseFormat | None, max_tokens: int) -> dict:
    [out] = llm.generate(ids, SamplingParams(max_tokens=max_tokens, response_format=response_format),
                         SpeculationParams(drafter))
    m = out.metrics
    grammar = m.grammar or GrammarMetrics()
    return {
        "token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason, "tokens": len(out.token_ids),
        "seconds": m.seconds, "tokens_per_second": m.tokens_per_second, "steps": m.steps,
        "draft_tokens": m.draft_tokens, "accepted_tokens": m.accepted_tokens,
        "grammar_seconds": grammar.seconds, "forced_draft_tokens": grammar.forced_draft_tokens,
        "forced_accepted_tokens": grammar.forced_accepted_tokens, "complete": grammar.complete,
    }


def summarize(rows: list[dict]) -> dict:
    """One configuration over a set of prompts (each row: one prompt, its runs over rounds)."""
    per_prompt_tps = [statistics.median(r["tokens_per_second"] for r in row["runs"]) for row in rows]
    first = [row["runs"][0] for row in rows]
    tokens, steps = sum(r["tokens"] for r in first), sum(r["steps"] for r in first)
    grammar_seconds = [r["grammar_seconds"] for row in rows for r in row["runs"]]
    all_steps = [r["steps"] for row in rows for r in row["runs"]]
    seconds = [r["seconds"] for row in rows for r in row["runs"]]
    return {
        "tokens_per_second": statistics.median(per_prompt_tps),
        "tokens_per_step": tokens / steps if steps else 0.0,  # the first token comes from prefill, not a step
        "parses": sum(row["parses"] for row in rows) / len(rows),
        "validates": sum(row["validates"] for row in rows) / len(rows),
        "finished": sum(r["finish_reason"] == "stop" for r in first) / len(rows),
        "forced_share": (sum(row.get("forced", 0) for row in rows) / tokens) if tokens else 0.0,
        "forced_draft_tokens": sum(r["forced_draft_tokens"] for r in first),
        "forced_accepted_tokens": sum(r["forced_accepted_tokens"] for r in first),
        "grammar_us_per_step": 1e6 * sum(grammar_seconds) / sum(all_steps) if sum(all_steps) else 0.0,
        "grammar_share": sum(grammar_seconds) / sum(seconds) if sum(seconds) else 0.0,
    }


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--prompts", type=int, default=8, help="JSON prompts (half BFCL, half extraction)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", "--k", type=int, default=5)
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    llm = LLM(loaded, drafters=["none", "ngram"], k=args.k, max_batch=1, prefix_cache_mb=0)
    compiler = GrammarCompiler(loaded.tokenizer, llm.engine.verifier.vocab_size, loaded.eos_token_ids)
    prompts = load_domain("json", args.prompts)
    warm = encode_prompt(loaded.tokenizer, "Say hello.")
    llm.generate(warm, SamplingParams(max_tokens=8, response_format=ResponseFormat.json_object()))
    cells: dict[str, list[dict]] = {label(*c): [] for c in CONFIGS}
    for prompt in prompts:
        ids = encode_prompt(loaded.tokenizer, prompt.messages)
        response_format = ResponseFormat.json_schema(prompt.schema)
        runs: dict[str, list[dict]] = {label(*c): [] for c in CONFIGS}
        for round_ in range(args.rounds):
            order = CONFIGS[round_ % len(CONFIGS):] + CONFIGS[: round_ % len(CONFIGS)]
            for drafter, constrained in order:
                runs[label(drafter, constrained)].append(
                    run_one(llm, ids, drafter, response_format if constrained else None, args.max_tokens))
        for constrained in (False, True):
            plain, ngram = runs[label("none", constrained)], runs[label("ngram", constrained)]
            assert all(r["token_ids"] == plain[0]["token_ids"] for r in plain + ngram), f"{prompt.id}: outputs differ"
        for name, cell in runs.items():
            parses, validates = valid(cell[0]["text"], prompt.schema)
            row = {"id": prompt.id, "source": prompt.source, "parses": parses, "validates": validates, "runs": cell}
            if name.endswith("schema"):
                row["forced"] = forced_tokens(compiler, response_format, cell[0]["token_ids"])
            cells[name].append(row)
        print(f"{prompt.id}: " + ", ".join(f"{name} {statistics.median(r['tokens_per_second'] for r in cell):.1f}"
                                           for name, cell in runs.items()), flush=True)

    sources = sorted({p.source for p in prompts})
    summary = {scope: {name: summarize([r for r in rows if scope == "all" or r["source"] == scope])
                       for name, rows in cells.items()} for scope in ["all", *sources]}
    results = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "model": loaded.name, "k": args.k, "max_tokens": args.max_tokens, "rounds": args.rounds,
        "prompts": len(prompts), "summary": summary,
        "cells": {name: [{**row, "runs": [{k: v for k, v in r.items() if k != "token_ids"} for r in row["runs"]]}
                         for row in rows] for name, rows in cells.items()},
    }
    write_results(args.out, "structured", results, render(results))


def render(results: dict) -> str:
    lines = [
        "# Structured output: the JSON domain with and without a schema",
        "",
        f"Machine: {results['machine']}. Model: {results['model']}. Greedy, {results['max_tokens']} new tokens at most, "
        f"k = {results['k']}; {results['prompts']} JSON prompts (BFCL function calls and extraction), one request at a "
        f"time, {results['rounds']} rounds with the four configurations interleaved (order rotating). `schema`: "
        "`response_format` json_schema with the prompt's answer schema; `free`: no constraint. Run with "
        "`python -m benchmarks.serving.structured`.",
        "",
        "tok/s: median over prompts of each prompt's median over rounds; speed-up: `ngram` over `none` in the same "
        "mode; tokens/step: output tokens per target step; forced: share of output tokens the grammar forced (replayed); "
        "forced drafts accepted: accepted / drafted forced tokens; grammar: its time per step (masks, cutting drafts, "
        "forced tokens, advancing) and share of the request's time; parses / validates: outputs that parse as JSON / "
        "validate against the schema; finished: outputs that ended on their own (not at the budget).",
        "",
        "| scope | config | tok/s | speed-up | tokens/step | forced | forced drafts accepted | grammar µs/step | grammar share | parses | validates | finished |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scope, cells in results["summary"].items():
        for name, s in cells.items():
            drafter, mode = name.split()
            base = cells[f"none {mode}"]["tokens_per_second"]
            constrained = mode == "schema"
            accepted = (f"{s['forced_accepted_tokens']}/{s['forced_draft_tokens']}"
                        if constrained and s["forced_draft_tokens"] else "-")
            forced = f"{100 * s['forced_share']:.0f}%" if constrained else "-"
            grammar_us = f"{s['grammar_us_per_step']:.0f}" if constrained else "-"
            grammar_share = f"{100 * s['grammar_share']:.1f}%" if constrained else "-"
            lines.append(
                f"| {scope} | {name} | {s['tokens_per_second']:.1f} | {s['tokens_per_second'] / base:.2f}x | "
                f"{s['tokens_per_step']:.2f} | {forced} | {accepted} | {grammar_us} | {grammar_share} | "
                f"{100 * s['parses']:.0f}% | {100 * s['validates']:.0f}% | {100 * s['finished']:.0f}% |")
    lines += ["", "Greedy outputs of `ngram` equal `none`'s in each mode, for every prompt and round (the run asserts it)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
