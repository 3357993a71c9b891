"""Long prompts through `specdraft serve`: how fast a prompt of thousands of tokens prefills, whether
a short request beside it waits for it, and whether the memory it took comes back.

A server as a user starts it (`specdraft serve`, default settings, plus `--model` where given):
- prefill rate: completions of one token on prompts of each `--lengths` (random words, a new prompt
  each time: no prefix-cache hit), prompt tokens a second from the request's wall time, `--rounds`
  rounds, medians, and each length's rate over the first length's (the pp512 rate);
- overtaking: a `--long`-token prompt (4 new tokens) sent, then after `--gap` seconds a short chat
  request (4 new tokens, streamed): the short one's time to first token and end, and the long one's;
- memory: the server's resident set (VmRSS) after start, its peak (VmHWM) and its resident set
  after `--memory-prompts` prompts of `--long-memory` tokens one after another, less the bytes the
  prefix cache holds then (its budget is memory kept on purpose; `specdraft_prefix_cache_bytes`).

    python -m benchmarks.serving.long_prompts [--model NAME] [--lengths 512,2048,4096,8000] [--rounds 2]
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

import httpx

from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.serving.load import server_pid

WORDS = ("dog", "cat", "river", "stone", "green", "quiet", "runs", "under", "bright", "table", "seven", "over")


def words(count: int, seed: int) -> str:
    """`count` random words (about a token each), different for every seed."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(count))


def status(pid: int, field: str) -> int:
    """A /proc/PID/status figure in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def prefix_bytes(url: str) -> int:
    """What the server's prefix cache holds now (its /metrics gauge)."""
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("specdraft_prefix_cache_bytes "):
            return int(float(line.split()[1]))
    return 0


def complete(url: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(seconds, prompt tokens) of one non-streamed completion."""
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                       timeout=1200)
    reply.raise_for_status()
    return time.perf_counter() - started, reply.json()["usage"]["prompt_tokens"]


def first_token(url: str, content: str, max_tokens: int) -> tuple[float, float]:
    """(seconds to the first streamed text, seconds to the end) of a streamed chat request."""
    started, first = time.perf_counter(), None
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1200) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
    return first if first is not None else float("nan"), time.perf_counter() - started


def overtaking(url: str, long: int, gap: float, seed: int) -> dict:
    """A short request sent `gap` seconds after a `long`-word prompt: both requests' times."""
    result: dict = {}

    def send_long() -> None:
        result["long_seconds"], result["long_tokens"] = complete(url, words(long, seed), 4)

    thread = threading.Thread(target=send_long)
    thread.start()
    time.sleep(gap)
    result["short_first_token"], result["short_seconds"] = first_token(url, "Name a colour.", 4)
    thread.join()
    return result


def measure(model: str | None, lengths: list[int], rounds: int, long: int, gap: float, memory_prompts: int,
            long_memory: int) -> dict:
    args = ("--model", model) if model else ()
    with live_server(*args) as url:
        pid = server_pid(url)
        complete(url, words(16, -1), 1)  # the first request's one-off costs, out of every figure
        start_rss = status(pid, "VmRSS")
        seed = 0
        rates: dict[int, list[float]] = {n: [] for n in lengths}
        tokens: dict[int, int] = {}
        for _ in range(rounds):
            for n in lengths:
                seed += 1
                seconds, tokens[n] = complete(url, words(n, seed), 1)
                rates[n].append(tokens[n] / seconds)
        overtakes = []
        for _ in range(rounds):
            seed += 1
            overtakes.append(overtaking(url, long, gap, seed))
        after = []
        for _ in range(memory_prompts):
            seed += 1
            complete(url, words(long_memory, seed), 4)
            after.append(status(pid, "VmRSS"))
        held = prefix_bytes(url)
        end_rss, peak = status(pid, "VmRSS"), status(pid, "VmHWM")
    first = statistics.median(rates[lengths[0]])
    return {
        "model": model or "embedded",
        "prefill": [{"words": n, "prompt_tokens": tokens[n], "tokens_per_second": statistics.median(rates[n]),
                     "runs": rates[n], "over_first": statistics.median(rates[n]) / first} for n in lengths],
        "overtaking": {"long_words": long, "gap_seconds": gap, "runs": overtakes,
                       "short_first_token": statistics.median(r["short_first_token"] for r in overtakes),
                       "short_seconds": statistics.median(r["short_seconds"] for r in overtakes),
                       "long_seconds": statistics.median(r["long_seconds"] for r in overtakes)},
        "memory": {"prompts": memory_prompts, "prompt_words": long_memory, "start_rss": start_rss,
                   "rss_after_each": after, "end_rss": end_rss, "peak_rss": peak, "prefix_cache_bytes": held,
                   "growth_less_prefix_cache": end_rss - held - start_rss},
    }


def markdown(result: dict) -> str:
    mb = 1 << 20
    lines = [f"# Long prompts through `specdraft serve`\n",
             f"{result['date']}, {result['machine']}; load {result['load_before']:.2f} before; "
             f"`python -m benchmarks.serving.long_prompts {result['command']}`. Medians of {result['rounds']} rounds.\n"]
    for run in result["runs"]:
        lines += [f"## {run['model']}\n", "| prompt tokens | prefill tok/s | over the first length's |", "| --- | --- | --- |"]
        lines += [f"| {p['prompt_tokens']} | {p['tokens_per_second']:.0f} | {p['over_first']:.2f}x |" for p in run["prefill"]]
        o, m = run["overtaking"], run["memory"]
        lines += ["", f"A short chat request sent {o['gap_seconds']} s after a {o['long_words']}-word prompt: its first "
                      f"token after **{o['short_first_token']:.2f} s**, its end after {o['short_seconds']:.2f} s; the long "
                      f"prompt's request took {o['long_seconds']:.1f} s.", "",
                  f"Memory: {m['start_rss'] / mb:.0f} MB after start; after {m['prompts']} prompts of "
                  f"{m['prompt_words']} words {m['end_rss'] / mb:.0f} MB, of which the prefix cache holds "
                  f"{m['prefix_cache_bytes'] / mb:.0f} MB: **{m['growth_less_prefix_cache'] / mb:+.0f} MB** over the "
                  f"start besides it; peak {m['peak_rss'] / mb:.0f} MB. After each: "
                  + ", ".join(f"{b / mb:.0f}" for b in m["rss_after_each"]) + " MB.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--models", default="", help="comma-separated models (empty: the embedded one)")
    parser.add_argument("--lengths", default="512,2048,4096,8000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long", type=int, default=6000)
    parser.add_argument("--gap", type=float, default=0.5)
    parser.add_argument("--memory-prompts", type=int, default=10)
    parser.add_argument("--long-memory", type=int, default=8000)
    parser.add_argument("--name", default="long_prompts")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    lengths = [int(n) for n in args.lengths.split(",")]
    runs = [measure(model or None, lengths, args.rounds, args.long, args.gap, args.memory_prompts, args.long_memory)
            for model in args.models.split(",")]
    command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out",))
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "rounds": args.rounds, "command": command, "runs": runs}
    write_results(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
