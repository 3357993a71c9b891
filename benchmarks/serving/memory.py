"""Resident memory of `specdraft serve` on the embedded model, native weights against dense ones.

For each `--weights` setting, a server as a user starts it (`specdraft serve --weights W`), its
resident set (VmRSS) read from /proc once it answers /health, and again after one short chat
request (what the first request adds: its buffers, the compiled step's scratch), with what the
resident set holds after it: anonymous memory (the weights' tiles, the caches, the heap), the GGUF
files' pages mapped in, and other files' (shared libraries); the settings alternate over `--rounds`
rounds, medians reported; and the seconds from starting the process to its first answer on /health
(start-up, with every cache warm: files fetched, kernels compiled, and, after a first start, the
calibration kept), and the seconds the first request took (32 tokens: what a start leaves to it).

    python -m benchmarks.serving.memory [--rounds 2] [--out benchmarks/results/serving]
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import statistics
import time
from pathlib import Path

from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.serving.load import server_pid

SETTINGS = ("dense", "native")


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def resident_parts(pid: int) -> dict:
    """What the resident set holds: anonymous bytes, the GGUF files' mapped pages, other files' pages."""
    parts, path = {"anonymous": 0, "gguf": 0, "other_files": 0}, ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header: its path, if any, last
            path = fields[5] if len(fields) > 5 else ""
        elif fields[0] == "Rss:":
            part = "gguf" if path.endswith(".gguf") else "other_files" if path.startswith("/") else "anonymous"
            parts[part] += int(fields[1]) * 1024
    return parts


def measure(weights: str, extra: list[str]) -> dict:
    import httpx

    start = time.monotonic()
    with live_server("--weights", weights, *extra) as url:
        ready = time.monotonic() - start
        pid = server_pid(url)
        started = resident_bytes(pid)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        asked = time.monotonic()
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 32, "messages": [{"role": "user", "content": "Name three rivers."}]})
        reply.raise_for_status()
        answered = time.monotonic() - asked
        return {"after_start": started, "after_a_request": resident_bytes(pid), **resident_parts(pid),
                "start_seconds": ready, "first_request_seconds": answered}


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weights", default=",".join(SETTINGS), help="the settings to alternate, comma-separated")
    parser.add_argument("--serve-args", default="", help="more arguments for `specdraft serve` (default: none, the "
                        "embedded model), e.g. \"--model qwen2.5-coder-1.5b-instruct --draft-model ...\"")
    args = parser.parse_args()
    settings, extra = args.weights.split(","), shlex.split(args.serve_args)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {w: [] for w in settings}
    for r in range(args.rounds):
        for weights in settings:
            runs[weights].append(measure(weights, extra))
            print(f"round {r + 1} {weights}: " + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in runs[weights][-1].items()),
                  flush=True)
    medians = {w: {k: statistics.median(run[k] for run in rows) for k in rows[0]} for w, rows in runs.items()}
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "rounds": args.rounds, "serve_args": extra, "runs": runs, "median": medians}
    write_results(args.out, "serve_memory", result, report(result))


def report(result: dict) -> str:
    medians, extra = result["median"], " ".join(result["serve_args"])
    lines = [
        "# Resident memory of `specdraft serve`: native weights against dense ones",
        "",
        f"{result['date']}, {result['machine']}; load average {result['load_before']:.2f} at the start. "
        f"`specdraft serve --weights W {extra or '(the embedded model)'}` as a user starts it (default drafters, prefix "
        f"cache on, empty); VmRSS, medians of {result['rounds']} alternating rounds. Run with "
        f"`python -m benchmarks.serving.memory`.",
        "",
        "| weights | after start | after one request | of which anonymous | GGUF files' pages | other files' | start-up | "
        "first request |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {w} | {m['after_start'] / 1e6:.0f} MB | {m['after_a_request'] / 1e6:.0f} MB | "
          + " | ".join(f"{m[k] / 1e6:.0f} MB" if k in m else "—" for k in ("anonymous", "gguf", "other_files"))
          + "".join(f" | {m[k]:.1f} s" if k in m else " | —" for k in ("start_seconds", "first_request_seconds")) + " |"
          for w, m in medians.items()),
    ]
    lines += ["", "Start-up by round (s): " + "; ".join(
        f"{w} " + ", ".join(f"{run['start_seconds']:.1f}" for run in rows) for w, rows in result["runs"].items()
        if all("start_seconds" in run for run in rows))]
    if {"native", "dense"} <= set(medians):
        lines += ["", f"Native over dense after start: {medians['native']['after_start'] / medians['dense']['after_start']:.2f}x."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
