"""Many requests at once through two servers on the same pair of GGUF files: `specdraft serve` (the
1.5B; `none`, `ngram` and `hybrid` by request, the 0.5B drafting for `hybrid`) against llama.cpp's
`llama-server -np N` (the same 1.5B; plain, and with `-md` the same 0.5B drafting), the same prompts
(code, JSON and prose, from the per-domain benchmark), greedy, streamed.

At each concurrency N, N requests are sent at once, each a different prompt. Per method: aggregate
tokens/s (completion tokens over the wall time from the first send to the last token), each request's
latency (send to its last token: median and worst) and time to first token; and whether each reply
equals the one its server's plain decoding gives that prompt sent alone (specdraft `none` for ours,
`llama-server` with one slot for llama.cpp's). The replies sent alone give the one-at-a-time rate
beside them. Methods interleaved, the order rotating, rounds repeated; medians over rounds.

    python -m benchmarks.serving.concurrent_servers --llama-cpp <llama.cpp build/bin> [--levels 8,16] [--rounds 2]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.domains.plots import bar_plot
from benchmarks.serving.agent_servers import llama_server
from benchmarks.serving.load import stream
from specdraft.models import find

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
OURS = ("none", "ngram", "hybrid")  # the drafter each request names; `none` sent alone is ours' reference
PAUSE = 2.0  # seconds between batches (no server's threads still spinning when the next one starts)


def prompts(count: int) -> list[list[dict]]:
    """`count` chat prompts, the domains taking turns (code, JSON, prose, code, ...)."""
    per_domain = -(-count // len(DOMAINS))
    by_domain = [load_domain(domain, per_domain) for domain in DOMAINS]
    return [by_domain[i % len(DOMAINS)][i // len(DOMAINS)].messages for i in range(count)]


def llama_argv(folder: Path, target: Path, draft: Path, slots: int, k: int, p_min: float) -> list[str]:
    """`llama-server` with `slots` parallel slots (2048 tokens of context each); with k > 0 the draft
    model drafting up to k tokens a step (`draft-simple`, kept while its probability is >= p_min)."""
    binary = folder / "llama-server"
    if not binary.is_file():
        raise FileNotFoundError(f"llama-server not found in {folder} (build it: benchmarks/results/cpu/int8/README.md)")
    argv = [str(binary), "-m", str(target), "-np", str(slots), "-c", str(2048 * slots), "--no-cache-prompt"]
    if k:
        argv += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                 "--spec-draft-p-min", str(p_min)]
    return argv


async def at_once(url: str, bodies: list[dict]) -> dict:
    """Send every body at once; the batch's aggregate rate and each request's result."""
    start = time.perf_counter()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(bodies) + 4)) as client:
        results = await asyncio.gather(*(stream(client, url, b) for b in bodies))
    wall = time.perf_counter() - start
    errors = [r["error"] for r in results if r.get("error")]
    if errors:
        raise RuntimeError(f"{url}: {len(errors)} of {len(bodies)} requests failed: {errors[0]}")
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    return {"seconds": wall, "tokens": tokens, "tokens_per_second": tokens / wall,
            "latencies": [r["seconds"] for r in results], "ttfts": [r["ttft"] for r in results],
            "texts": [r["text"] for r in results]}


async def alone(url: str, bodies: list[dict]) -> dict:
    """Send the bodies one after the other: the references, and the one-at-a-time rate."""
    start, texts, tokens = time.perf_counter(), [], 0
    async with httpx.AsyncClient() as client:
        for b in bodies:
            result = await stream(client, url, b)
            if result.get("error"):
                raise RuntimeError(f"{url}: {result['error']}")
            texts.append(result["text"])
            tokens += result["usage"]["completion_tokens"]
    return {"texts": texts, "tokens_per_second": tokens / (time.perf_counter() - start)}


def request(messages: list[dict], max_tokens: int, extra: dict) -> dict:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}


def main() -> None:
    parser = cli(__doc__, RESULTS / "pair" / "concurrent_servers")
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's build/bin (llama-server)")
    parser.add_argument("--levels", default="8,16", help="requests sent at once, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("-k", "--k", type=int, default=5, help="draft length (both servers)")
    parser.add_argument("--p-min", type=float, default=0.75, help="llama-server's --spec-draft-p-min")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    levels = [int(n) for n in args.levels.split(",")]
    chats = prompts(max(levels))
    target, draft = find.fetch(TARGET), find.fetch(DRAFT)
    with ExitStack() as stack:
        ours = stack.enter_context(live_server(
            "--model", TARGET, "--draft-model", DRAFT, "--drafters", ",".join(OURS), "-k", str(args.k),
            "--max-batch-size", str(max(levels)), "--prefix-cache-mb", "0", log=args.out / "specdraft.log"))
        methods = {name: (ours, {"speculation": {"drafter": name}}) for name in OURS}
        theirs: dict[str, dict[int, str]] = {}  # llama.cpp's method -> slots -> its server's URL

        def start(name: str, slots: int, k: int) -> str:
            argv = llama_argv(args.llama_cpp, target, draft, slots, k, args.p_min)
            log = args.out / f"{name.replace(' ', '_')}_np{slots}.log"
            return stack.enter_context(llama_server(argv, args.threads, log))

        reference_llama = start("llama-server", 1, 0)
        for name, k in (("llama-server", 0), (f"llama-server -md k{args.k}", args.k)):
            theirs[name] = {n: start(name, n, k) for n in levels}
            methods[name] = (None, {})
        print("references (each prompt alone) ...", flush=True)
        references = {
            "ours": asyncio.run(alone(ours, [request(c, args.max_tokens, methods["none"][1]) for c in chats])),
            "llama.cpp": asyncio.run(alone(reference_llama, [request(c, args.max_tokens, {}) for c in chats]))}
        runs = []
        for round_ in range(args.rounds):
            for level in levels:
                order = list(methods)
                shift = (round_ + level) % len(order)
                for name in order[shift:] + order[:shift]:
                    url, extra = methods[name]
                    url = url or theirs[name][level]
                    time.sleep(PAUSE)
                    run = asyncio.run(at_once(url, [request(c, args.max_tokens, extra) for c in chats[:level]]))
                    side = "llama.cpp" if name in theirs else "ours"
                    run["equal"] = sum(a == b for a, b in zip(run.pop("texts"), references[side]["texts"]))
                    runs.append({"round": round_, "level": level, "method": name, **run})
                    print(f"round {round_ + 1}, {level} at once, {name}: {run['tokens_per_second']:.1f} tok/s, "
                          f"{run['equal']}/{level} equal", flush=True)
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "target": TARGET, "draft": DRAFT, "k": args.k, "p_min": args.p_min, "max_tokens": args.max_tokens,
               "threads": args.threads, "rounds": args.rounds, "levels": levels,
               "alone": {side: r["tokens_per_second"] for side, r in references.items()},
               "summary": summarize(runs, levels, list(methods)), "runs": runs}
    write_results(args.out, "concurrent_servers", results, render(results))
    plot(results, args.out / "concurrent_servers.png")


def summarize(runs: list[dict], levels: list[int], names: list[str]) -> list[dict]:
    """Per concurrency and method, medians over rounds (ratios to llama-server's plain aggregate)."""
    out = []
    for level in levels:
        plain = statistics.median(r["tokens_per_second"] for r in runs if r["level"] == level
                                  and r["method"] == "llama-server")
        for name in names:
            chosen = [r for r in runs if r["level"] == level and r["method"] == name]
            rate = statistics.median(r["tokens_per_second"] for r in chosen)
            out.append({"level": level, "method": name, "tokens_per_second": rate,
                        "rounds": [r["tokens_per_second"] for r in chosen],
                        "over_llama_server": rate / plain,
                        "latency_median": statistics.median(statistics.median(r["latencies"]) for r in chosen),
                        "latency_worst": statistics.median(max(r["latencies"]) for r in chosen),
                        "ttft_median": statistics.median(statistics.median(r["ttfts"]) for r in chosen),
                        "equal": min(r["equal"] for r in chosen)})
    return out


def render(results: dict) -> str:
    lines = ["# Many requests at once: specdraft serve against llama-server, the same two GGUF files", "",
             f"Machine: {results['machine']}. Target {results['target']}, draft {results['draft']} (Q4_K_M files "
             f"from the catalogue); {results['threads']} threads each. Greedy, {results['max_tokens']} new tokens at "
             f"most, k = {results['k']} (llama.cpp: `--spec-type draft-simple --spec-draft-p-min {results['p_min']}`); "
             "N different prompts (code, JSON and prose in turn) sent at once, streamed; methods interleaved, "
             f"{results['rounds']} rounds, medians. Aggregate: completion tokens over the wall time of the whole "
             "batch; latency: a request's send to its last token (median, and the worst of the batch); equal: "
             "replies equal to the server's plain decoding of the prompt sent alone (the fewest over rounds). "
             "One at a time (each prompt alone, in turn): specdraft `none` "
             f"{results['alone']['ours']:.1f} tok/s, llama-server {results['alone']['llama.cpp']:.1f} tok/s. Run with "
             "`python -m benchmarks.serving.concurrent_servers --llama-cpp <build/bin>`.", "",
             "| at once | method | aggregate tok/s | over llama-server | by round | latency median s | "
             "latency worst s | TTFT median s | equal |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in results["summary"]:
        rounds = ", ".join(f"{r:.1f}" for r in c["rounds"])
        lines.append(f"| {c['level']} | {c['method']} | {c['tokens_per_second']:.1f} | {c['over_llama_server']:.2f}x | "
                     f"{rounds} | {c['latency_median']:.1f} | {c['latency_worst']:.1f} | {c['ttft_median']:.2f} | "
                     f"{c['equal']}/{c['level']} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    levels = results["levels"]
    names = list(dict.fromkeys(c["method"] for c in results["summary"]))
    rate = {(c["level"], c["method"]): c["tokens_per_second"] for c in results["summary"]}
    series = {name: [rate[(level, name)] for level in levels] for name in names}
    bar_plot(path, [f"{level} at once" for level in levels], series, "aggregate tokens/s (median over rounds)",
             "Many requests at once: specdraft serve against llama-server", baseline=None)


if __name__ == "__main__":
    main()
