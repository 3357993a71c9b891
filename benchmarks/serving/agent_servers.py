"""Multi-turn agent traces through two servers on the same pair of GGUF files: `specdraft serve`
(the 1.5B target; `none`, `ngram`, `model` and `hybrid` by request, the 0.5B drafting for the last
two) against llama.cpp's `llama-server` (the same 1.5B; plain, and with `-md` the same 0.5B drafting k),
each with its prompt cache on, as agents meet them.

BFCL multi-turn conversations are replayed turn by turn at batch 1: each turn is a new chat request
carrying the whole conversation so far (the tools in the system prompt, every earlier user turn and
that method's own replies), greedy, streamed. Each method keeps its own cached prompts: specdraft's
by a cache salt of its own (one server, one prefix cache), llama.cpp's by a server of its own (one
slot). Per turn the methods run one after the other, the order rotating, a pause between requests
(no server's threads still spinning when the next request starts). Reported per turn index (1, 2, 3+)
and over all turns: time to first token (the new part of the prompt prefilled), decode tokens/s after
it, tokens/s over the whole turn, the prompt tokens served from the cache, drafts accepted; and
whether each method's reply equals its server's plain decoding's.

    python -m benchmarks.serving.agent_servers --llama-cpp <llama.cpp build/bin> [--conversations 2]
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from benchmarks.common import RESULTS, cli, free_port, live_server, machine, wait_healthy, write_results
from benchmarks.domains.datasets import load_conversations
from benchmarks.domains.plots import bar_plot
from benchmarks.serving.agent import by_turn
from specdraft.models import find

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
OURS = ("none", "ngram", "model", "hybrid")  # specdraft's methods: the drafter each request names
PLAIN = "none"  # each server's plain decoding: what its other methods are held to
LLAMA_PLAIN = "llama-server"
PAUSE = 1.0  # seconds between requests


def llama_server_methods(folder: Path, target: Path, draft: Path, k: int) -> dict[str, list[str]]:
    """llama.cpp's methods: name -> the `llama-server` command (but its port and threads)."""
    binary = folder / "llama-server"
    if not binary.is_file():
        raise FileNotFoundError(f"llama-server not found in {folder} (build it: benchmarks/results/cpu/int8/README.md)")
    plain = [str(binary), "-m", str(target), "-np", "1", "-c", "16384", "--cache-prompt"]
    return {LLAMA_PLAIN: plain,
            f"llama-server -md k{k}": [*plain, "-md", str(draft), "--spec-type", "draft-simple",
                                       "--spec-draft-n-max", str(k)]}


@contextmanager
def llama_server(argv: list[str], threads: int, log: Path, startup_timeout: float = 300.0):
    """Yield the base URL of a `llama-server` on a free loopback port; stop it after."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([*argv, "-t", str(threads), "--port", str(port), "--host", "127.0.0.1"],
                                stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(proc, url, "llama-server", startup_timeout, lambda: log.read_text())
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def turn(url: str, messages: list[dict], max_tokens: int, extra: dict) -> dict:
    """One streamed greedy chat request: its reply, time to first token, decode speed, usage."""
    import httpx

    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    text, first, usage, timings = [], None, {}, {}
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - start
                    text.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    seconds = time.perf_counter() - start
    tokens = int(usage["completion_tokens"])
    first = seconds if first is None else first
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n", 0)
    speculation = usage.get("speculation") or {}
    drafted = speculation.get("draft_tokens", timings.get("draft_n", 0))
    accepted = speculation.get("accepted_tokens", timings.get("draft_n_accepted", 0))
    return {"text": "".join(text), "tokens": tokens, "prompt_tokens": int(usage["prompt_tokens"]),
            "cached_tokens": int(cached or 0), "seconds": seconds, "time_to_first_token": first,
            "tokens_per_second": tokens / seconds,
            "decode_tokens_per_second": (tokens - 1) / (seconds - first) if tokens > 1 and seconds > first else 0.0,
            "draft_tokens": int(drafted or 0), "accepted_tokens": int(accepted or 0)}


def main() -> None:
    import httpx

    parser = cli(__doc__, RESULTS / "pair" / "agent_servers")
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's build/bin (llama-server)")
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("-k", "--k", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    target, draft = find.fetch(TARGET), find.fetch(DRAFT)
    servers = llama_server_methods(args.llama_cpp, target, draft, args.k)
    conversations = load_conversations(args.conversations)
    turns = []
    with ExitStack() as stack:
        ours = stack.enter_context(live_server(
            "--model", TARGET, "--draft-model", DRAFT, "--drafters", ",".join(OURS), "-k", str(args.k),
            "--prefix-cache-mb", "4096", log=args.out / "specdraft.log"))
        served = httpx.get(f"{ours}/v1/models").json()["data"][0]["id"]
        urls = {name: (ours, {"model": served, "speculation": {"drafter": name}, "cache_salt": f"agent-{name}"})
                for name in OURS}
        for name, argv in servers.items():
            log = args.out / f"{name.replace(' ', '_')}.log"
            urls[name] = (stack.enter_context(llama_server(argv, args.threads, log)), {})
        replies: dict[str, list[str]] = {}
        for c_index, conversation in enumerate(conversations):
            replies = {name: [] for name in urls}
            for index in range(len(conversation.turns)):
                order = list(urls)
                shift = (c_index + index) % len(order)
                runs = {}
                for name in order[shift:] + order[:shift]:
                    url, extra = urls[name]
                    time.sleep(PAUSE)
                    runs[name] = turn(url, conversation.messages(index, replies[name]), args.max_tokens, extra)
                for name, run in runs.items():
                    replies[name].append(run["text"])
                turns.append({"conversation": conversation.id, "turn": index, "runs": runs,
                              "equal": {name: same_history(replies, name) for name in runs}})
                print(f"{conversation.id} turn {index + 1}: " + ", ".join(
                    f"{name} {run['time_to_first_token']:.1f}s+{run['decode_tokens_per_second']:.1f} tok/s"
                    for name, run in runs.items()), flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "target": TARGET, "draft": DRAFT, "k": args.k, "max_tokens": args.max_tokens, "threads": args.threads,
               "llama_cpp": {name: argv[1:] for name, argv in servers.items()},
               "conversations": len(conversations), "summary": summarize(turns), "turns": turns}
    write_results(args.out, "agent_servers", results, render(results))
    plot(results, args.out / "agent_servers.png")


def same_history(replies: dict[str, list[str]], name: str) -> bool:
    """Whether the method's replies so far equal its server's plain decoding's (every turn's)."""
    plain = LLAMA_PLAIN if name.startswith("llama-server") else PLAIN
    return replies[name] == replies[plain]


def summarize(turns: list[dict]) -> dict:
    """Per turn index and over all turns, each method's medians (and ratios to specdraft's `none`)."""
    out = {}
    for scope, chosen in by_turn(turns):
        cells = {}
        for name in chosen[0]["runs"]:
            runs = [t["runs"][name] for t in chosen]
            drafted = sum(r["draft_tokens"] for r in runs)
            cells[name] = {
                "time_to_first_token": statistics.median(r["time_to_first_token"] for r in runs),
                "decode_tokens_per_second": statistics.median(r["decode_tokens_per_second"] for r in runs),
                "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
                "speedup": statistics.median(r["tokens_per_second"] / t["runs"][PLAIN]["tokens_per_second"]
                                             for r, t in zip(runs, chosen)),
                "cached_share": statistics.median(r["cached_tokens"] / r["prompt_tokens"] for r in runs),
                "prompt_tokens": statistics.median(r["prompt_tokens"] for r in runs),
                "accepted_per_drafted": sum(r["accepted_tokens"] for r in runs) / drafted if drafted else None,
                "equal": sum(t["equal"][name] for t in chosen)}
        out[scope] = {"turns": len(chosen), "cells": cells}
    return out


def render(results: dict) -> str:
    lines = ["# Agent traces through the servers: specdraft against llama-server, the same two GGUF files", "",
             f"Machine: {results['machine']}. Target {results['target']}, draft {results['draft']} (Q4_K_M files from "
             f"the catalogue); {results['threads']} threads each. Greedy, {results['max_tokens']} new tokens at most, "
             f"k = {results['k']}, batch 1, streamed; {results['conversations']} BFCL multi-turn conversations replayed "
             "turn by turn, each turn a new request with the whole history (that method's own replies); methods one "
             "after the other per turn, the order rotating, each with its own prompt cache (specdraft: a cache salt "
             "per method; llama.cpp: a server per method, one slot, `--cache-prompt`). TTFT: median time to first "
             "token; decode tok/s: after it; tok/s: the whole turn; speed-up: median per-turn ratio of tok/s to "
             "specdraft `none`; cached: median share of the prompt served from the cache; equal: turns whose "
             "history so far equals its server's plain decoding's (`none`, `llama-server`). Run with "
             "`python -m benchmarks.serving.agent_servers --llama-cpp <build/bin>`.", "",
             "| turn | turns | method | prompt tokens | TTFT s | decode tok/s | tok/s | speed-up | cached | "
             "accepted/drafted | equal |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for scope, s in results["summary"].items():
        for name, c in s["cells"].items():
            accepted = "-" if c["accepted_per_drafted"] is None else f"{c['accepted_per_drafted']:.2f}"
            lines.append(f"| {scope} | {s['turns']} | {name} | {c['prompt_tokens']:.0f} | {c['time_to_first_token']:.2f} | "
                         f"{c['decode_tokens_per_second']:.1f} | {c['tokens_per_second']:.1f} | {c['speedup']:.2f}x | "
                         f"{c['cached_share']:.0%} | {accepted} | {c['equal']}/{s['turns']} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    scopes = [scope for scope in ("1", "2", "3+") if scope in results["summary"]]
    names = list(results["summary"]["all"]["cells"])
    series = {name: [results["summary"][scope]["cells"][name]["tokens_per_second"] for scope in scopes] for name in names}
    bar_plot(path, [f"turn {scope}" for scope in scopes], series, "tokens/s (whole turn, median)",
             "Agent traces: specdraft serve against llama-server", baseline=None)


if __name__ == "__main__":
    main()
