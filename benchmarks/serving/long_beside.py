"""One long prompt beside short requests through `specdraft serve`: the memory the server takes while they
run together, and how fast the short ones go, for this checkout and, with `--before REV`, that revision's
(a git worktree), interleaved round by round.

Each round, for each checkout in turn: a server started from it (`specdraft serve --max-batch-size
--short + 1 --prefix-cache-mb 0`: the prefix cache's memory kept on purpose is out of the figure), one
warm-up request, then a `--long`-word completion (4 new tokens) and `--short` completions of 48 words each
(`--max-tokens` new tokens, greedy) sent at once. The server's resident set (VmRSS) is read every 20 ms
from just before they are sent: its peak over the figure before, and the figure after they end; the short
ones' median and worst seconds and their generated tokens a second together; the long one's seconds; and
whether every reply equals the first checkout's (greedy output must not change).

    python -m benchmarks.serving.long_beside [--before REV] [--model NAME] [--long 8000] [--short 15] [--rounds 3]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.serving.load import server_pid
from benchmarks.serving.long_prompts import status, words

ROOT = Path(__file__).resolve().parents[2]


def completion(url: str, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """(seconds, text, generated tokens) of one greedy completion."""
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
                       timeout=1800)
    reply.raise_for_status()
    body = reply.json()
    return time.perf_counter() - started, body["choices"][0]["text"], body["usage"]["completion_tokens"]


def sampled_peak(pid: int, done: threading.Event) -> list[int]:
    """The largest VmRSS read every 20 ms until `done` (a one-item list, filled in by a thread)."""
    peak = [status(pid, "VmRSS")]

    def watch() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], status(pid, "VmRSS"))

    threading.Thread(target=watch, daemon=True).start()
    return peak


def together(checkout: Path, model: str | None, long: int, short: int, max_tokens: int, seed: int) -> dict:
    """One round on a server started from `checkout` (on `model`, default the embedded one)."""
    args = ("--max-batch-size", str(short + 1), "--prefix-cache-mb", "0", *(("--model", model) if model else ()))
    with live_server(*args, cwd=checkout) as url:
        pid = server_pid(url)
        completion(url, words(16, -1), 1)  # the first request's one-off costs, out of every figure
        before, done = status(pid, "VmRSS"), threading.Event()
        peak = sampled_peak(pid, done)
        prompts = [(words(long, seed), 4)] + [(words(48, seed * 100 + i), max_tokens) for i in range(short)]
        started = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(lambda p: completion(url, *p), prompts))
        wall = time.perf_counter() - started
        done.set()
        after = status(pid, "VmRSS")
    shorts = replies[1:]
    return {"rss_before": before, "peak_over_before": max(peak[0], after) - before, "after_over_before": after - before,
            "long_seconds": replies[0][0], "short_median_seconds": statistics.median(r[0] for r in shorts),
            "short_worst_seconds": max(r[0] for r in shorts), "wall_seconds": wall,
            "short_tokens_per_second": sum(r[2] for r in shorts) / max(r[0] for r in shorts),
            "texts": [r[1] for r in replies]}


def worktree(rev: str) -> Path:
    """A detached worktree of `rev` (made once, kept under /tmp)."""
    path = Path("/tmp") / f"specdraft-{rev}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                       capture_output=True)
    return path


def summary(runs: list[dict]) -> dict:
    keys = ("peak_over_before", "after_over_before", "long_seconds", "short_median_seconds", "short_worst_seconds",
            "short_tokens_per_second", "wall_seconds")
    return {key: statistics.median(run[key] for run in runs) for key in keys}


def equal_replies(runs: list[dict], first: list[dict]) -> str:
    """How many of the runs' replies equal the first checkout's in the same round and place, of how many."""
    equal = sum(a == b for run, theirs in zip(runs, first) for a, b in zip(run["texts"], theirs["texts"]))
    return f"{equal}/{sum(len(run['texts']) for run in runs)}"


def markdown(result: dict) -> str:
    mb = 1 << 20
    lines = [f"# One long prompt beside short requests through `specdraft serve`\n",
             f"{result['date']}, {result['machine']}; load {result['load_before']:.2f} before; "
             f"`python -m benchmarks.serving.long_beside {result['command']}`; the {result['model']} model. "
             f"A {result['long']}-word prompt and "
             f"{result['short']} short completions ({result['max_tokens']} tokens each, greedy) sent at once; "
             f"medians of {result['rounds']} rounds, the checkouts interleaved.\n",
             "| checkout | peak RSS over before | RSS after over before | long prompt s | short median / worst s "
             "| short tok/s together | replies equal to the first checkout's |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, side in result["checkouts"].items():
        m = side["median"]
        lines.append(f"| {name} | **{m['peak_over_before'] / mb:.0f} MB** | {m['after_over_before'] / mb:+.0f} MB | "
                     f"{m['long_seconds']:.1f} | {m['short_median_seconds']:.1f} / {m['short_worst_seconds']:.1f} | "
                     f"{m['short_tokens_per_second']:.1f} | {side['equal_replies']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--before", default=None, help="a revision to measure beside this checkout")
    parser.add_argument("--model", default=None, help="the server's model (default the embedded one)")
    parser.add_argument("--long", type=int, default=8000)
    parser.add_argument("--short", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="long_beside")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    checkouts = {"this checkout": ROOT}
    if args.before:
        checkouts = {f"before ({args.before})": worktree(args.before), **checkouts}
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for round_ in range(args.rounds):
        for name, path in checkouts.items():
            runs[name].append(together(path, args.model, args.long, args.short, args.max_tokens, seed=round_ + 1))
    first = next(iter(runs.values()))
    sides = {name: {"median": summary(rs), "runs": rs, "equal_replies": equal_replies(rs, first)}
             for name, rs in runs.items()}
    command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None)
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "model": args.model or "embedded", "long": args.long,
              "short": args.short, "max_tokens": args.max_tokens, "rounds": args.rounds, "command": command,
              "checkouts": sides}
    write_results(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
