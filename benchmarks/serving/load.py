"""Load on the server (loopback only; bounded in requests and time; it starts and stops its own
servers): the embedded model behind `specdraft serve`, greedy.

1. Soak: `--clients` concurrent streaming clients for `--seconds`; every streamed completion must
   equal its greedy reference (the same prompt decoded alone with plain decoding, non-streamed);
   throughput, p50/p99 time to first token and inter-chunk latency, errors.
2. Disconnects: `--disconnects` clients hang up after their first chunk; afterwards the server must
   hold zero running rows, and its resident memory is compared with before.
3. Admission: the inter-chunk latency of 8 running streams before and while a ~4k-token prompt is
   prefilled (chunked prefill keeps streams flowing).
4. Concurrency 1, 4, 8, 16: aggregate tokens/s with `none` and with `ngram`, interleaved, repeated.
5. Memory: a sequence of similar JSON-extraction requests (each prompt seen once), with and without
   `--ngram-memory`: acceptance and tokens/s.

    python -m benchmarks.serving.load [--clients 32] [--seconds 60] [--out benchmarks/results/serving]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain

MAX_TOKENS = 64


async def stream(client: httpx.AsyncClient, url: str, body: dict, hang_up_after: int | None = None) -> dict:
    """One streamed request: its text, time to first chunk, gaps between chunks, usage, error."""
    start = time.perf_counter()
    chunks, times, usage, error = [], [], None, None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True,
                                 "stream_options": {"include_usage": True}}, timeout=600) as response:
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                    break
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        chunks.append(text)
                        times.append(time.perf_counter())
                        if hang_up_after is not None and len(chunks) >= hang_up_after:
                            return {"hung_up": True}
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    gaps = list(np.diff(times)) if len(times) > 1 else []
    return {"text": "".join(chunks), "ttft": times[0] - start if times else None, "gaps": gaps, "usage": usage,
            "error": error, "seconds": time.perf_counter() - start}


def body(messages: list[dict], drafter: str = "ngram", max_tokens: int = MAX_TOKENS) -> dict:
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "speculation": {"drafter": drafter}}


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


async def references(url: str, prompts: list[list[dict]]) -> list[str]:
    async with httpx.AsyncClient() as client:
        out = []
        for messages in prompts:
            response = await client.post(f"{url}/v1/chat/completions", json=body(messages, "none"), timeout=600)
            out.append(response.json()["choices"][0]["message"]["content"])
        return out


async def soak(url: str, prompts: list[list[dict]], refs: list[str], clients: int, seconds: float) -> dict:
    deadline = time.perf_counter() + seconds
    results: list[dict] = []

    async def client_loop(i: int, client: httpx.AsyncClient):
        j = i
        while time.perf_counter() < deadline:
            result = await stream(client, url, body(prompts[j % len(prompts)]))
            result["equal"] = result.get("text") == refs[j % len(prompts)]
            results.append(result)
            j += clients

    start = time.perf_counter()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients + 8)) as client:
        await asyncio.gather(*(client_loop(i, client) for i in range(clients)))
    wall = time.perf_counter() - start
    ok = [r for r in results if not r.get("error")]
    tokens = sum(r["usage"]["completion_tokens"] for r in ok if r.get("usage"))
    return {
        "clients": clients, "seconds": wall, "requests": len(results), "errors": len(results) - len(ok),
        "error_examples": [r["error"] for r in results if r.get("error")][:3],
        "not_equal_to_reference": sum(1 for r in ok if not r["equal"]),
        "tokens": tokens, "tokens_per_second": tokens / wall,
        "ttft": percentiles([r["ttft"] for r in ok if r["ttft"] is not None]),
        "inter_chunk": percentiles([g for r in ok for g in r["gaps"]]),
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def disconnects(url: str, pid: int, prompts: list[list[dict]], count: int) -> dict:
    before = rss_kib(pid)
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=count + 4)) as client:
        await asyncio.gather(*(stream(client, url, body(prompts[i % len(prompts)], max_tokens=512), hang_up_after=1)
                               for i in range(count)))
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            health = (await client.get(f"{url}/health")).json()
            if health["running"] == 0 and health["waiting"] == 0:
                break
            await asyncio.sleep(0.25)
    await asyncio.sleep(1.0)
    after = rss_kib(pid)
    return {"clients": count, "running_after": health["running"], "waiting_after": health["waiting"],
            "rss_before_mib": before / 1024, "rss_after_mib": after / 1024, "rss_growth_mib": (after - before) / 1024}


async def admission(url: str, prompts: list[list[dict]], long_tokens: int) -> dict:
    """Gaps of 8 streams in the 5 s before a long prompt arrives (once all 8 stream), and while it is prefilled."""
    long_text = " ".join(f"item {i}: value {i * 7 % 1000}." for i in range(long_tokens // 12))  # ~12 tokens an item
    marks: dict[str, float] = {}
    streaming = asyncio.Semaphore(0)  # released once per stream at its first chunk

    async def long_request(client):
        for _ in range(8):
            await streaming.acquire()
        await asyncio.sleep(5.0)
        marks["sent"] = time.perf_counter()
        result = await stream(client, url, body([{"role": "user", "content": "Summarise: " + long_text}], "none", 8))
        marks["first"] = marks["sent"] + (result["ttft"] or 0.0)
        marks["prompt_tokens"] = result["usage"]["prompt_tokens"] if result.get("usage") else None

    async def running(client, messages):
        times = []
        start = time.perf_counter()
        async with client.stream("POST", f"{url}/v1/chat/completions", json={**body(messages, "none", 400), "stream": True},
                                 timeout=600) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    times.append(time.perf_counter())
                    if len(times) == 2:  # the role chunk, then the first token
                        streaming.release()
        return times, start

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=16)) as client:
        streams = asyncio.gather(*(running(client, prompts[i % len(prompts)]) for i in range(8)))
        await long_request(client)
        series = await streams
    before, during = [], []
    for times, _ in series:
        for a, b in zip(times, times[1:]):
            if marks["sent"] - 5.0 <= a and b <= marks["sent"]:
                before.append(b - a)
            elif a >= marks["sent"] and b <= marks["first"]:
                during.append(b - a)
    return {"long_prompt_tokens": marks.get("prompt_tokens"), "prefill_seconds": marks["first"] - marks["sent"],
            "gaps_before": percentiles(before), "gaps_during": percentiles(during),
            "max_gap_during": max(during) if during else None, "chunks_during": len(during)}


async def concurrency(url: str, prompts: list[list[dict]], levels: list[int], repeats: int, per_client: int) -> list[dict]:
    cells = []
    for _ in range(repeats):
        for level in levels:
            for drafter in ("none", "ngram"):
                start = time.perf_counter()
                async with httpx.AsyncClient(limits=httpx.Limits(max_connections=level + 4)) as client:
                    async def one_client(i):
                        out = []
                        for j in range(per_client):
                            out.append(await stream(client, url, body(prompts[(i * per_client + j) % len(prompts)], drafter)))
                        return out
                    results = [r for rs in await asyncio.gather(*(one_client(i) for i in range(level))) for r in rs]
                wall = time.perf_counter() - start
                tokens = sum(r["usage"]["completion_tokens"] for r in results if r.get("usage"))
                cells.append({"concurrency": level, "drafter": drafter, "tokens_per_second": tokens / wall,
                              "errors": sum(1 for r in results if r.get("error"))})
    summary = []
    for level in levels:
        row = {"concurrency": level}
        for drafter in ("none", "ngram"):
            runs = [c["tokens_per_second"] for c in cells if c["concurrency"] == level and c["drafter"] == drafter]
            row[drafter] = statistics.median(runs)
            row[f"{drafter}_runs"] = runs
        row["ratio"] = row["ngram"] / row["none"]
        summary.append(row)
    return summary


def extraction_prompts(count: int, seed: int = 0) -> list[list[dict]]:
    """Similar JSON-extraction requests: the same schema, different records, each seen once."""
    rng = random.Random(seed)
    names = ["Ada", "Brook", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
    cities = ["Lyon", "Oslo", "Porto", "Kyoto", "Quito", "Riga", "Tunis", "Perth"]
    out = []
    for _ in range(count):
        people = rng.sample(names, 3)
        text = " ".join(f"{p} is {rng.randint(20, 70)} and lives in {rng.choice(cities)}." for p in people)
        out.append([{"role": "user", "content": "Extract the people as a JSON list of objects with keys "
                                                "\"name\", \"age\" and \"city\", in this order. Answer with JSON only.\n\n" + text}])
    return out


async def memory_effect(url: str, prompts: list[list[dict]]) -> dict:
    async with httpx.AsyncClient() as client:
        drafted = accepted = tokens = 0
        start = time.perf_counter()
        for messages in prompts:
            result = await stream(client, url, body(messages, "ngram", 96))
            stats = result["usage"]["speculation"]
            drafted += stats["draft_tokens"]
            accepted += stats["accepted_tokens"]
            tokens += result["usage"]["completion_tokens"]
        wall = time.perf_counter() - start
    return {"requests": len(prompts), "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_tokens": accepted, "draft_tokens": drafted, "tokens_per_second": tokens / wall}


def server_pid(url: str) -> int:
    """The pid listening on the server's port (the process live_server started)."""
    port = url.rsplit(":", 1)[1]
    import subprocess

    out = subprocess.run(["pgrep", "-f", f"serve --port {port}"], capture_output=True, text=True).stdout.split()
    return int(out[0])


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--disconnects", type=int, default=50)
    parser.add_argument("--long-prompt", type=int, default=4096, help="tokens of the prompt admitted under load")
    parser.add_argument("--levels", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-requests", type=int, default=16)
    args = parser.parse_args()

    prompts = [p.messages for d in DOMAINS for p in load_domain(d, 6)]
    serve = ["--max-batch-size", "16", "--max-queue", "128", "--drafters", "none,ngram"]
    result = {"machine": machine(), "max_tokens": MAX_TOKENS, "prompts": len(prompts)}
    with live_server(*serve) as url:
        pid = server_pid(url)
        refs = asyncio.run(references(url, prompts))
        print("references done", flush=True)
        result["soak"] = asyncio.run(soak(url, prompts, refs, args.clients, args.seconds))
        print("soak", result["soak"], flush=True)
        result["disconnects"] = asyncio.run(disconnects(url, pid, prompts, args.disconnects))
        print("disconnects", result["disconnects"], flush=True)
        result["admission"] = asyncio.run(admission(url, prompts, args.long_prompt))
        print("admission", result["admission"], flush=True)
        levels = [int(x) for x in args.levels.split(",")]
        result["concurrency"] = asyncio.run(concurrency(url, prompts, levels, args.repeats, per_client=2))
        print("concurrency", result["concurrency"], flush=True)
    workload = extraction_prompts(args.memory_requests)
    result["memory"] = {}
    for label, extra in (("without", []), ("with", ["--ngram-memory"])):
        with live_server("--max-batch-size", "4", "--drafters", "ngram", *extra) as url:
            result["memory"][label] = asyncio.run(memory_effect(url, workload))
        print("memory", label, result["memory"][label], flush=True)
    write(result, args.out)
    print((args.out / "load.md").read_text())


def write(result: dict, out: Path) -> None:
    ms = lambda x: "—" if x is None else f"{1000 * x:.0f} ms"  # noqa: E731
    soak, gone, adm, mem = result["soak"], result["disconnects"], result["admission"], result["memory"]
    lines = [
        "# The server under load",
        "",
        f"Machine: {result['machine']}. `specdraft serve` on the embedded SmolLM2-135M-Instruct (fp32, CPU), "
        f"max batch 16, greedy chat completions of {result['max_tokens']} tokens over {result['prompts']} prompts "
        "(code, JSON, prose). Run with `python -m benchmarks.serving.load`; it starts and stops its own servers on loopback.",
        "",
        f"## Soak: {soak['clients']} streaming clients for {soak['seconds']:.0f} s (ngram)",
        "",
        f"- {soak['requests']} requests, {soak['errors']} errors, {soak['not_equal_to_reference']} completions different "
        "from their greedy reference (each prompt decoded alone with plain decoding)",
        f"- throughput {soak['tokens_per_second']:.1f} tok/s; time to first token p50 {ms(soak['ttft']['p50'])}, "
        f"p99 {ms(soak['ttft']['p99'])}; gap between chunks p50 {ms(soak['inter_chunk']['p50'])}, "
        f"p99 {ms(soak['inter_chunk']['p99'])}",
        "",
        f"## {gone['clients']} clients that disconnect after their first chunk",
        "",
        f"- afterwards: {gone['running_after']} running rows, {gone['waiting_after']} waiting; server memory "
        f"{gone['rss_before_mib']:.0f} MiB before, {gone['rss_after_mib']:.0f} MiB after ({gone['rss_growth_mib']:+.1f} MiB)",
        "",
        "## A long prompt admitted while 8 streams run",
        "",
        f"- a {adm['long_prompt_tokens']}-token prompt took {adm['prefill_seconds']:.1f} s to its first token; meanwhile "
        f"the 8 streams got {adm['chunks_during']} chunks, gap p50 {ms(adm['gaps_during']['p50'])}, p99 "
        f"{ms(adm['gaps_during']['p99'])}, max {ms(adm['max_gap_during'])} (before it arrived: p50 "
        f"{ms(adm['gaps_before']['p50'])}, p99 {ms(adm['gaps_before']['p99'])})",
        "",
        "## Aggregate tokens/s by concurrency (median of runs, interleaved)",
        "",
        "| concurrency | none | ngram | ngram / none | runs (none; ngram) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in result["concurrency"]:
        lines.append(f"| {row['concurrency']} | {row['none']:.1f} | {row['ngram']:.1f} | {row['ratio']:.2f}x | "
                     f"{', '.join(f'{x:.1f}' for x in row['none_runs'])}; {', '.join(f'{x:.1f}' for x in row['ngram_runs'])} |")
    lines += [
        "",
        f"## Cross-request memory: {mem['without']['requests']} similar JSON-extraction requests, one after another (ngram)",
        "",
        "| server | acceptance | accepted / drafted tokens | tok/s |",
        "| --- | --- | --- | --- |",
    ]
    for label in ("without", "with"):
        m = mem[label]
        lines.append(f"| {label} --ngram-memory | {m['acceptance_rate']:.2f} | {m['accepted_tokens']} / {m['draft_tokens']} | "
                     f"{m['tokens_per_second']:.1f} |")
    write_results(out, "load", result, "\n".join(lines))


if __name__ == "__main__":
    main()
