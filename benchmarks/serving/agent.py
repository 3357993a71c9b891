"""Multi-turn agent traces: BFCL multi-turn conversations replayed turn by turn, at batch 1.

Each turn is a new request carrying the whole conversation so far (the tools in the system prompt,
every earlier user turn and the assistant's reply to it), as agents send them, and the turns of a
conversation follow each other, conversations one after another. Per turn, greedy, the methods run
one after the other (the order rotating): specdraft `none`, `ngram`, `hybrid`, `ngram` with the
cross-request memory (its own engine, whose memory has learned from every earlier request of the
run, the turns before this one included), `ngram` with longer drafts (`--long-ks`), Hugging Face
`generate` (the reference: every output must equal it) and its prompt lookup. The reply of each turn
(the same for every method) joins the history of the next. Reported by turn index (1, 2, 3+) and over
all turns: tokens/s (median over turns; prefill included, and it is most of a turn's work here: the
prompt is several thousand tokens), the speed-up over `none`, tokens per target step, drafted tokens
per step and accepted per drafted token; memory on against memory off (`ngram`) by turn index; and
what an oracle copy drafter could reach (`benchmarks.serving.ceiling`) from the request alone and with every
earlier turn's output as well (the most a cross-request memory could add).

    python -m benchmarks.serving.agent [--conversations 4] [--max-tokens 96] [--long-ks 16]
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path
from typing import Iterator

from benchmarks.serving.ceiling import UNBOUNDED, copy_ceiling
from benchmarks.common import RESULTS, cli, machine, step_columns, step_stats, write_results
from benchmarks.domains.datasets import load_conversations
from benchmarks.domains.methods import OURS, PEERS, REFERENCE, Methods, display_order
from benchmarks.domains.plots import bar_plot
from specdraft.models import load_model
from specdraft.runtime import encode_prompt


def bucket(turn: int) -> str:
    return str(turn + 1) if turn < 2 else "3+"


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("-k", "--k", type=int, default=5)
    parser.add_argument("--long-ks", default="16", help="also `ngram` with these longest drafts (comma-separated)")
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    methods = Methods(loaded, OURS + PEERS, k=args.k, max_tokens=args.max_tokens,
                      long_ks=tuple(int(k) for k in args.long_ks.split(",") if k.strip()))
    turns = []
    outputs: list[list[int]] = []  # every earlier turn's output: what a cross-request memory can know
    conversations = load_conversations(args.conversations)
    for c_index, conversation in enumerate(conversations):
        replies: list[str] = []
        for turn in range(len(conversation.turns)):
            ids = encode_prompt(loaded.tokenizer, conversation.messages(turn, replies))
            order = list(methods.names)
            shift = (c_index + turn) % len(order)
            runs = {name: methods.run(name, ids) for name in order[shift:] + order[:shift]}
            reference = runs[REFERENCE]["token_ids"]
            lossless = {name: run["token_ids"] == reference for name, run in runs.items()}
            replies.append(loaded.tokenizer.decode(reference, skip_special_tokens=True))
            ceiling = {f"{where} k={k}": copy_ceiling(ids, reference, bound, corpus)
                       for where, corpus in (("context", ()), ("context+earlier outputs", outputs))
                       for k, bound in ((args.k, args.k), ("unbounded", UNBOUNDED))}
            outputs.append(reference)
            turns.append({"conversation": conversation.id, "turn": turn, "prompt_tokens": len(ids),
                          "tokens": len(reference), "lossless": lossless, "copy_ceiling": ceiling,
                          "runs": {name: {k: v for k, v in run.items() if k != "token_ids"} for name, run in runs.items()}})
            print(f"{conversation.id} turn {turn + 1} ({len(ids)} prompt tokens, {len(reference)} new): " + ", ".join(
                f"{name} {run['tokens_per_second']:.1f}" for name, run in runs.items()), flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "model": loaded.name, "k": args.k, "max_tokens": args.max_tokens, "conversations": len(conversations),
               "summary": summarize(turns), "turns": turns}
    write_results(args.out, "agent", results, render(results))
    plot(results, args.out / "agent.png")


def by_turn(turns: list[dict]) -> Iterator[tuple[str, list[dict]]]:
    """(scope, its turns): all turns, then those of each turn index (1, 2, 3+) that has any."""
    for scope in ("all", "1", "2", "3+"):
        chosen = [t for t in turns if scope == "all" or bucket(t["turn"]) == scope]
        if chosen:
            yield scope, chosen


def summarize(turns: list[dict]) -> dict:
    out = {}
    for scope, chosen in by_turn(turns):
        cells = {}
        for name in display_order(chosen[0]["runs"]):
            runs = [t["runs"][name] for t in chosen]
            cell = {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
                    "speedup": statistics.median(r["tokens_per_second"] / t["runs"]["none"]["tokens_per_second"]
                                                 for r, t in zip(runs, chosen)),
                    "lossless": sum(t["lossless"][name] for t in chosen)}
            if "steps" in runs[0]:
                cell["decode_tokens_per_second"] = statistics.median(r["decode_tokens_per_second"] for r in runs)
                cell["decode_speedup"] = statistics.median(
                    r["decode_tokens_per_second"] / t["runs"]["none"]["decode_tokens_per_second"] for r, t in zip(runs, chosen))
                cell.update(step_stats(runs))
                cell["time_to_first_token"] = statistics.median(r["time_to_first_token"] for r in runs)
                cell["ttft_over_none"] = statistics.median(
                    r["time_to_first_token"] / t["runs"]["none"]["time_to_first_token"] for r, t in zip(runs, chosen))
                cell["cached_share"] = statistics.median(r["cached_tokens"] / r["prompt_tokens"] for r in runs)
            cells[name] = cell
        memory = [t["runs"]["ngram+memory"]["tokens_per_second"] / t["runs"]["ngram"]["tokens_per_second"] for t in chosen]
        decode_memory = [t["runs"]["ngram+memory"]["decode_tokens_per_second"] / t["runs"]["ngram"]["decode_tokens_per_second"]
                         for t in chosen]
        ceiling = {key: statistics.median(t["copy_ceiling"][key] for t in chosen) for key in chosen[0]["copy_ceiling"]}
        out[scope] = {"turns": len(chosen), "cells": cells, "copy_ceiling": ceiling,
                      "memory_over_no_memory": statistics.median(memory),
                      "memory_ratios": memory, "decode_memory_over_no_memory": statistics.median(decode_memory),
                      "decode_memory_ratios": decode_memory}
    return out


def render(results: dict) -> str:
    lines = ["# Multi-turn agent traces (BFCL multi-turn), turn by turn", "",
             f"Machine: {results['machine']}. Model: {results['model']}. Greedy, {results['max_tokens']} new tokens at most, "
             f"k = {results['k']}, batch 1; {results['conversations']} conversations replayed turn by turn, each turn a new "
             "request with the whole history; methods one after the other per turn, the order rotating. tok/s: median "
             "over turns, prefill included (prompts of several thousand tokens: most of a turn's time); speed-up: median "
             "of per-turn ratios to `none`; tokens/step, drafted/step, accepted/drafted: over the turns' steps; lossless: "
             "turns whose output equals Hugging Face `generate`'s. `ngram+memory`: the cross-request memory, learned from "
             "every earlier request of the run. `+cache`: an engine of its own with the prefix cache (the others have "
             "none), holding what that method computed for the earlier turns; TTFT: median time to first token, and "
             "its median per-turn ratio to `none`'s (uncached); cached: median share of the prompt whose keys and "
             "values came from the cache. Run with `python -m benchmarks.serving.agent`.", "",
             "| turn | turns | method | tok/s | speed-up | decode tok/s | decode speed-up | TTFT s (x none) | cached | "
             "tokens/step | drafted/step | accepted/drafted | lossless |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for scope, s in results["summary"].items():
        for name, c in s["cells"].items():
            ours = "tokens_per_step" in c
            decode = f"{c['decode_tokens_per_second']:.1f} | {c['decode_speedup']:.2f}x" if ours else "- | -"
            first = (f"{c['time_to_first_token']:.2f} ({c['ttft_over_none']:.2f}x) | {c['cached_share']:.0%}"
                     if "cached_share" in c else "- | -")
            per_step = step_columns(c) if ours else "- | - | -"
            lines.append(f"| {scope} | {s['turns']} | {name} | {c['tokens_per_second']:.1f} | {c['speedup']:.2f}x | "
                         f"{decode} | {first} | {per_step} | {c['lossless']}/{s['turns']} |")
    lines += ["", "Decode tok/s: after the first token (prefill excluded), specdraft's methods only. Memory on / memory off "
              "(`ngram+memory` / `ngram`, median of per-turn ratios), tok/s and decode tok/s:", ""]
    lines += [f"- turn {scope}: {s['memory_over_no_memory']:.2f}x, decode {s['decode_memory_over_no_memory']:.2f}x "
              f"({s['turns']} turns)" for scope, s in results["summary"].items()]
    keys = list(results["summary"]["all"]["copy_ceiling"])
    lines += ["", "What copying could reach (`benchmarks/serving/ceiling.py`): tokens per target step of an oracle that drafts, "
              "after any earlier occurrence of the last token, the continuation agreeing longest with the output, from "
              "the request's context alone or also from every earlier turn's output in the run (all a cross-request "
              "memory can hold); median over turns.", "",
              "| turn | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    lines += [f"| {scope} | " + " | ".join(f"{s['copy_ceiling'][key]:.2f}" for key in keys) + " |"
              for scope, s in results["summary"].items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Decode speed-up over `none` (after the first token) by turn index, specdraft's drafters."""
    summary = results["summary"]
    scopes = [s for s in ("1", "2", "3+", "all") if s in summary]
    names = [n for n in summary["all"]["cells"] if n != "none" and "decode_speedup" in summary["all"]["cells"][n]]
    bar_plot(path, [f"turn {s}" for s in scopes],
             {n: [summary[s]["cells"][n]["decode_speedup"] for s in scopes] for n in names},
             "decode speed-up over none", f"Agent traces, batch 1 ({results['conversations']} conversations)")


if __name__ == "__main__":
    main()
