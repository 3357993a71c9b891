"""Multi-turn agent traces through the server, several conversations at once (loopback only; it starts
and stops its own servers): the embedded model behind `specdraft serve`, greedy, max batch 16.

One streaming client per BFCL multi-turn conversation (`benchmarks.domains.datasets.load_conversations`);
each client replays its conversation turn by turn, each turn a new chat request carrying the whole
history, the server's reply joining it, as an agent sends them. `--conversations` clients at once
(4 and 16 by default), each method on a fresh server of its own: `none` and `ngram` (with the prefix
cache, the server's default), `ngram` on a server started with `--ngram-memory` (its memory holds
only what this run's requests taught it), and `none` and `ngram` without the prefix cache
(`--prefix-cache-mb 0`), one after the other per concurrency, the order rotating each repeat
(`--methods` picks some). Every reply is compared with `none`'s for the same turn.

Reported per concurrency and method: aggregate completion tokens/s over the run's wall time, and by
turn index (1, 2, 3+) the median per-request tok/s and decode tok/s (after the first token), tokens
per target step, drafted per step and accepted per drafted token; memory on / memory off by turn
index (median of per-turn ratios); the share of each prompt that came from the prefix cache.

    python -m benchmarks.serving.agent_load [--conversations 4,16] [--repeats 1] [--max-tokens 96] [--methods none,ngram]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
from pathlib import Path

import httpx

from benchmarks.serving.agent import bucket
from benchmarks.common import RESULTS, cli, live_server, machine, step_columns, step_stats, write_results
from benchmarks.domains.datasets import load_conversations
from benchmarks.serving.load import body, stream
from benchmarks.domains.plots import bar_plot

SERVE = ("--max-batch-size", "16", "--max-queue", "64", "--drafters", "none,ngram")
NO_CACHE = ("--prefix-cache-mb", "0")
METHODS = {"none": ("none", ()), "ngram": ("ngram", ()), "ngram+memory": ("ngram", ("--ngram-memory",)),
           "none no-cache": ("none", NO_CACHE), "ngram no-cache": ("ngram", NO_CACHE)}


async def replay(url: str, conversations, drafter: str, max_tokens: int) -> tuple[list[dict], float]:
    """Every conversation replayed by its own client, all at once; each turn's reply and figures."""

    async def one(client: httpx.AsyncClient, conversation) -> list[dict]:
        replies, out = [], []
        for turn in range(len(conversation.turns)):
            result = await stream(client, url, body(conversation.messages(turn, replies), drafter, max_tokens))
            if result.get("error"):
                raise RuntimeError(f"{conversation.id} turn {turn + 1}: {result['error']}")
            replies.append(result["text"])
            usage = result["usage"]
            spec, tokens = usage["speculation"], usage["completion_tokens"]
            decode = result["seconds"] - result["ttft"]
            out.append({"conversation": conversation.id, "turn": turn, "text": result["text"],
                        "prompt_tokens": usage["prompt_tokens"], "tokens": tokens, "seconds": result["seconds"],
                        "ttft": result["ttft"], "tokens_per_second": tokens / result["seconds"],
                        "decode_tokens_per_second": (tokens - 1) / decode if tokens > 1 and decode > 0 else 0.0,
                        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                        "steps": spec["steps"], "draft_tokens": spec["draft_tokens"],
                        "accepted_tokens": spec["accepted_tokens"]})
        return out

    start = asyncio.get_running_loop().time()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(conversations) + 4)) as client:
        per_conversation = await asyncio.gather(*(one(client, c) for c in conversations))
    return [r for rs in per_conversation for r in rs], asyncio.get_running_loop().time() - start


def run_method(method: str, conversations, max_tokens: int) -> dict:
    drafter, extra = METHODS[method]
    with live_server(*SERVE, *extra) as url:
        requests, wall = asyncio.run(replay(url, conversations, drafter, max_tokens))
    tokens = sum(r["tokens"] for r in requests)
    return {"wall_seconds": wall, "tokens": tokens, "tokens_per_second": tokens / wall, "requests": requests}


def summarize(runs: list[dict]) -> dict:
    """Per concurrency: per method, aggregate tok/s (median over repeats) and by turn index the
    per-request figures pooled over repeats; memory on / off per turn index."""
    out = {}
    for n in sorted({r["conversations"] for r in runs}):
        chosen = [r for r in runs if r["conversations"] == n]
        reference = {(q["conversation"], q["turn"]): q["text"] for r in chosen if r["method"] == "none"
                     for q in r["requests"]}
        methods = {}
        for method in (m for m in METHODS if any(r["method"] == m for r in chosen)):
            mine = [r for r in chosen if r["method"] == method]
            requests = [q for r in mine for q in r["requests"]]
            scopes = {}
            for scope in ("all", "1", "2", "3+"):
                picked = [q for q in requests if scope == "all" or bucket(q["turn"]) == scope]
                if picked:
                    scopes[scope] = {
                        "requests": len(picked),
                        "tokens_per_second": statistics.median(q["tokens_per_second"] for q in picked),
                        "decode_tokens_per_second": statistics.median(q["decode_tokens_per_second"] for q in picked),
                        "ttft": statistics.median(q["ttft"] for q in picked),
                        "cached_share": statistics.median(q["cached_tokens"] / q["prompt_tokens"] for q in picked),
                        "equal_to_none": sum(q["text"] == reference.get((q["conversation"], q["turn"])) for q in picked),
                        **step_stats(picked)}
            methods[method] = {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in mine),
                               "runs": [r["tokens_per_second"] for r in mine], "by_turn": scopes}
        memory = {}
        for scope in ("all", "1", "2", "3+"):
            ratios = {key: _paired(chosen, scope, key) for key in ("tokens_per_second", "decode_tokens_per_second")}
            if ratios["tokens_per_second"]:
                memory[scope] = {key: statistics.median(v) for key, v in ratios.items()}
                memory[scope]["turns"] = len(ratios["tokens_per_second"])
        out[str(n)] = {"methods": methods, "memory_over_no_memory": memory}
    return out


def _paired(runs: list[dict], scope: str, key: str) -> list[float]:
    """Per (repeat, conversation, turn): memory on's figure over memory off's."""
    ratios = []
    for repeat in sorted({r["repeat"] for r in runs}):
        on = {(q["conversation"], q["turn"]): q[key] for r in runs if r["repeat"] == repeat
              and r["method"] == "ngram+memory" for q in r["requests"]}
        for r in runs:
            if r["repeat"] != repeat or r["method"] != "ngram":
                continue
            ratios += [on[(q["conversation"], q["turn"])] / q[key] for q in r["requests"]
                       if (scope == "all" or bucket(q["turn"]) == scope) and q[key] > 0
                       and (q["conversation"], q["turn"]) in on]
    return ratios


def render(results: dict) -> str:
    lines = ["# Multi-turn agent traces through the server", "",
             f"Machine: {results['machine']}. `specdraft serve` on the embedded SmolLM2-135M-Instruct (fp32, CPU), max "
             f"batch 16, k = 5 (the default), greedy chat completions of at most {results['max_tokens']} tokens; one "
             "streaming client per BFCL multi-turn conversation, each replaying its turns in order (each turn a new "
             "request with the whole history), all conversations at once; each method on a fresh server: `none` and "
             "`ngram` with the prefix cache (the default), `ngram+memory` with `--ngram-memory`, `no-cache` with "
             "`--prefix-cache-mb 0`; one after the other, the order rotating per "
             f"repeat ({results['repeats']}). aggregate tok/s: completion tokens over the wall time of the whole replay "
             "(median over repeats); by turn: medians over requests of tok/s (prefill included) and decode tok/s (after "
             "the first token), median time to first token, median share of the prompt taken from the prefix cache, "
             "tokens/step, drafted/step and accepted/drafted over the "
             "requests' steps; equal: replies identical to `none`'s. Run with `python -m benchmarks.serving.agent_load`.", ""]
    for n, s in results["summary"].items():
        lines += [f"## {n} conversations at once", "",
                  "| method | aggregate tok/s | turn | requests | tok/s | decode tok/s | TTFT | cached | tokens/step | "
                  "drafted/step | accepted/drafted | equal |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for method, m in s["methods"].items():
            for scope, c in m["by_turn"].items():
                aggregate = f"{m['tokens_per_second']:.1f}" if scope == "all" else ""
                lines.append(f"| {method} | {aggregate} | {scope} | {c['requests']} | {c['tokens_per_second']:.1f} | "
                             f"{c['decode_tokens_per_second']:.1f} | {c['ttft']:.1f} s | {c['cached_share']:.0%} | "
                             f"{step_columns(c)} | "
                             f"{c['equal_to_none']}/{c['requests']} |")
        if s["memory_over_no_memory"]:
            lines += ["", "Memory on / memory off (`ngram+memory` / `ngram`, median of per-turn ratios):", ""]
        lines += [f"- turn {scope}: tok/s {m['tokens_per_second']:.2f}x, decode tok/s "
                  f"{m['decode_tokens_per_second']:.2f}x ({m['turns']} turns)"
                  for scope, m in s["memory_over_no_memory"].items()]
        lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Aggregate completion tokens/s by conversations at once, one bar per method."""
    summary = results["summary"]
    groups = list(summary)
    bar_plot(path, [f"{n} conversations" for n in groups],
             {m: [summary[n]["methods"][m]["tokens_per_second"] for n in groups] for m in METHODS
              if all(m in summary[n]["methods"] for n in groups)},
             "aggregate tokens/s", "Agent traces through the server", baseline=None)


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--conversations", default="4,16", help="conversations at once, one run per value")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--methods", default=",".join(METHODS), help="which of: " + ", ".join(METHODS))
    args = parser.parse_args()

    runs = []
    order = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in order if m not in METHODS]
    if unknown:
        parser.error(f"unknown method {unknown[0]!r}; choose among: {', '.join(METHODS)}")
    for n in [int(x) for x in args.conversations.split(",")]:
        conversations = load_conversations(n)
        for repeat in range(args.repeats):
            shift = repeat % len(order)
            for method in order[shift:] + order[:shift]:
                run = run_method(method, conversations, args.max_tokens)
                runs.append({"conversations": n, "repeat": repeat, "method": method, **run})
                print(f"{n} conversations, {method}: {run['tokens_per_second']:.1f} tok/s over "
                      f"{run['wall_seconds']:.0f} s", flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "max_tokens": args.max_tokens, "repeats": args.repeats, "summary": summarize(runs), "runs": runs}
    write_results(args.out, "agent_load", results, render(results))
    plot(results, args.out / "agent_load.png")


if __name__ == "__main__":
    main()
