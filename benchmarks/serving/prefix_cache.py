"""The prefix cache through the default server: BFCL multi-turn conversations replayed turn by turn
against `specdraft serve` as a user starts it (the default drafter, the default cache), each turn
asked twice, one after the other: under the conversation's own `cache_salt` (warm: the history it
sent before is cached) and under a fresh salt (cold: nothing can be reused), the order alternating
per turn. Streamed greedy chat completions; the warm reply joins the history.

Reported per turn index: the replies' equality (warm == cold), `usage.prompt_tokens_details.cached_tokens`
over the prompt, time to first token warm and cold (and their ratio), and the server's /metrics
prompt-token counters at the end.

Then, in-process, the per-domain benchmark's prompts (`--prompts` a domain): each decoded greedily by
an engine without the cache (the reference) and by one with it, three times: cold, again (a hit on
all of the prompt but its last token), and as a second turn (the prompt, the reply and "Continue.":
a hit on the first turn and its reply, checked against the engine without the cache): how many
outputs equal the reference.

    python -m benchmarks.serving.prefix_cache [--conversations 4] [--max-tokens 64] [--prompts 6]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics

import httpx

from benchmarks.serving.agent import bucket
from benchmarks.common import RESULTS, cli, live_server, machine, write_results
from benchmarks.domains.datasets import load_conversations
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.serving.load import body, stream
from specdraft.models import load_model
from specdraft.params import DEFAULT_PREFIX_CACHE_MB, SamplingParams
from specdraft.runtime import build_runtime, encode_prompt
from specdraft.settings import Settings


async def replay(url: str, conversations, max_tokens: int) -> list[dict]:
    rows = []
    async with httpx.AsyncClient() as client:
        for c_index, conversation in enumerate(conversations):
            replies: list[str] = []
            for turn in range(len(conversation.turns)):
                messages = conversation.messages(turn, replies)
                salts = {"warm": f"conversation-{c_index}", "cold": f"fresh-{c_index}-{turn}"}
                order = ["warm", "cold"] if turn % 2 == 0 else ["cold", "warm"]
                results = {}
                for which in order:
                    request = {**body(messages, None, max_tokens), "cache_salt": salts[which]}
                    request.pop("speculation")  # the server's default drafter
                    results[which] = await stream(client, url, request)
                    if results[which].get("error"):
                        raise RuntimeError(f"{conversation.id} turn {turn + 1}: {results[which]['error']}")
                warm, cold = results["warm"], results["cold"]
                replies.append(warm["text"])
                rows.append({"conversation": conversation.id, "turn": turn,
                             "prompt_tokens": warm["usage"]["prompt_tokens"],
                             "cached_warm": warm["usage"]["prompt_tokens_details"]["cached_tokens"],
                             "cached_cold": cold["usage"]["prompt_tokens_details"]["cached_tokens"],
                             "ttft_warm": warm["ttft"], "ttft_cold": cold["ttft"], "equal": warm["text"] == cold["text"]})
                print(f"{conversation.id} turn {turn + 1}: {rows[-1]}", flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {}
    for scope in ("all", "1", "2", "3+"):
        picked = [r for r in rows if scope == "all" or bucket(r["turn"]) == scope]
        if picked:
            out[scope] = {"turns": len(picked), "equal": sum(r["equal"] for r in picked),
                          "cached_share_warm": statistics.median(r["cached_warm"] / r["prompt_tokens"] for r in picked),
                          "cached_cold": max(r["cached_cold"] for r in picked),
                          "ttft_warm": statistics.median(r["ttft_warm"] for r in picked),
                          "ttft_cold": statistics.median(r["ttft_cold"] for r in picked),
                          "ttft_ratio": statistics.median(r["ttft_warm"] / r["ttft_cold"] for r in picked)}
    return out


def lossless_on_domains(prompts: int, max_tokens: int) -> dict:
    """Per domain: outputs of the cached engine (cold, repeated, second turn) equal to the uncached one's."""
    loaded = load_model(None, device=None, dtype="auto")
    cached = build_runtime(loaded, Settings(max_batch=1)).engine
    plain = build_runtime(loaded, Settings(max_batch=1, prefix_cache_mb=0)).engine
    params = SamplingParams(max_tokens=max_tokens)
    out = {}
    for domain in DOMAINS:
        counts = {"cold": 0, "again": 0, "second turn": 0, "prompts": 0, "cached_again": [], "cached_second": []}
        for prompt in load_domain(domain, prompts):
            ids = encode_prompt(loaded.tokenizer, prompt.messages)
            [reference] = plain.run([(ids, params)])
            [cold], [again] = cached.run([(ids, params)]), cached.run([(ids, params)])
            follow = encode_prompt(loaded.tokenizer, [*prompt.messages, {"role": "assistant", "content": reference.text},
                                                      {"role": "user", "content": "Continue."}])
            [second_reference], [second] = plain.run([(follow, params)]), cached.run([(follow, params)])
            counts["prompts"] += 1
            counts["cold"] += cold.token_ids == reference.token_ids
            counts["again"] += again.token_ids == reference.token_ids
            counts["second turn"] += second.token_ids == second_reference.token_ids
            counts["cached_again"].append(again.metrics.cached_tokens / len(ids))
            counts["cached_second"].append(second.metrics.cached_tokens / len(follow))
        out[domain] = counts
        print(domain, {k: v for k, v in counts.items() if not k.startswith("cached")}, flush=True)
    return out


def render(results: dict) -> str:
    lines = ["# The prefix cache through the default server", "",
             f"Machine: {results['machine']}. `specdraft serve` with its defaults (the embedded model, the default "
             f"drafter, a {results['prefix_cache_mb']} MiB prefix cache); {results['conversations']} BFCL multi-turn "
             f"conversations replayed turn by turn, greedy streamed chat completions of at most {results['max_tokens']} "
             "tokens, each turn asked under the conversation's own `cache_salt` (warm) and under a fresh one (cold), "
             "the order alternating per turn. cached: `usage.prompt_tokens_details.cached_tokens` over the prompt "
             "(median; cold: the largest seen); TTFT: median time to first token, and the median per-turn ratio warm / "
             "cold; equal: turns whose warm and cold replies are identical. Run with `python -m benchmarks.serving.prefix_cache`.",
             "", "| turn | turns | equal | cached warm | cached cold (max) | TTFT warm | TTFT cold | warm / cold |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for scope, s in results["summary"].items():
        lines.append(f"| {scope} | {s['turns']} | {s['equal']}/{s['turns']} | {s['cached_share_warm']:.0%} | "
                     f"{s['cached_cold']} | {s['ttft_warm']:.2f} s | {s['ttft_cold']:.2f} s | {s['ttft_ratio']:.2f} |")
    lines += ["", "The server's counters at the end (`/metrics`):", ""]
    lines += [f"- `{line}`" for line in results["metrics"]]
    lines += ["", f"The per-domain prompts in-process ({results['domain_prompts']} a domain, greedy, "
              f"{results['max_tokens']} new tokens, the default drafter): outputs with the cache equal to the "
              "engine's without it, cold, repeated (cached share in brackets, median) and as a second turn:", "",
              "| domain | cold | repeated | second turn |", "| --- | --- | --- | --- |"]
    for domain, c in results["domains"].items():
        n = c["prompts"]
        lines.append(f"| {domain} | {c['cold']}/{n} | {c['again']}/{n} ({statistics.median(c['cached_again']):.0%}) | "
                     f"{c['second turn']}/{n} ({statistics.median(c['cached_second']):.0%}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=6, help="per-domain prompts a domain (0: none)")
    args = parser.parse_args()

    conversations = load_conversations(args.conversations)
    with live_server() as url:
        rows = asyncio.run(replay(url, conversations, args.max_tokens))
        metrics = [line for line in httpx.get(f"{url}/metrics").text.splitlines()
                   if line.startswith(("specdraft_prompt_tokens_total", "specdraft_prefix_cache_"))]
    domains = lossless_on_domains(args.prompts, args.max_tokens) if args.prompts else {}
    results = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
               "max_tokens": args.max_tokens, "conversations": len(conversations),
               "prefix_cache_mb": DEFAULT_PREFIX_CACHE_MB, "summary": summarize(rows), "metrics": metrics,
               "domain_prompts": args.prompts, "domains": domains, "turns": rows}
    write_results(args.out, "prefix_cache", results, render(results))


if __name__ == "__main__":
    main()
