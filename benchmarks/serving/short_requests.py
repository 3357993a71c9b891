"""Short requests with a costly drafter: a request the cost-aware policy never lets draft must cost
no more than plain decoding.

As `specdraft generate --drafter model` runs them: one request at a time on an engine fresh from its
start-up calibration (the policy knows this machine's costs but nothing yet of the request), greedy,
a short budget, on prompts held out from every calibration (each domain's first
`CALIBRATION_PROMPTS` prompts are left to calibrations, the next ones are held out). Each request runs with `none` and
with each costly drafter, interleaved, `--rounds` times; the report gives median tokens/s (the
request's own, as the CLI prints it: prefill included, start-up not), their ratio, and what the
policy let the drafter do (draft tokens, mean accepted length).

    python -m benchmarks.serving.short_requests [--drafters model] [--max-tokens 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain
from specdraft.api.protocol import metrics_json
from specdraft.engine import Engine
from specdraft.models import load_model
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.policy import DraftPolicy
from specdraft.runtime import build_runtime, encode_prompt
from specdraft.settings import Settings

CALIBRATION_PROMPTS = 2  # per domain, skipped: the prompts the self-drafts were chosen on


def arguments() -> argparse.Namespace:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--drafters", default="model", help="costly drafters to compare with none")
    parser.add_argument("--held-out", type=int, default=2, help="held-out prompts per domain")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", "--k", type=int, default=5)
    return parser.parse_args()


def build_engines(loaded, names: list[str], k: int) -> tuple[dict[str, Engine], dict[str, DraftPolicy]]:
    """One engine per drafter, as the CLI builds one, and a copy of its policy right after calibration:
    the state every request starts from."""
    engines = {name: build_runtime(loaded, Settings(drafters=[name], k=k, max_batch=1, prefix_cache_mb=0)).engine
               for name in names}
    fresh = {name: copy.deepcopy(engine.policy) for name, engine in engines.items()}
    return engines, fresh


def held_out_prompts(tokenizer, held_out: int) -> list[tuple[str, str, list[int]]]:
    """(domain, prompt id, token ids) of each domain's `held_out` prompts after its calibration prompts."""
    return [(d, p.id, encode_prompt(tokenizer, p.messages))
            for d in DOMAINS for p in load_domain(d, CALIBRATION_PROMPTS + held_out)[CALIBRATION_PROMPTS:]]


def run_rounds(engines: dict[str, Engine], fresh: dict[str, DraftPolicy], names: list[str],
               prompts: list[tuple[str, str, list[int]]], params: SamplingParams,
               rounds: int) -> dict[tuple[str, str], list[dict]]:
    """(domain, drafter) -> each request's metrics, every prompt run alone on an engine reset to its
    fresh policy, the drafters interleaved (their order reversed every other round); asserts every
    drafter's output equals `none`'s."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(rounds):
        for domain, prompt_id, ids in prompts:
            outputs = {}
            for name in names if round_ % 2 == 0 else reversed(names):
                engine = engines[name]
                engine.policy = copy.deepcopy(fresh[name])
                [done] = engine.run([(ids, params, SpeculationParams(name))])
                outputs[name] = done.token_ids
                runs.setdefault((domain, name), []).append({"id": prompt_id, **metrics_json(done.metrics)})
            assert all(out == outputs["none"] for out in outputs.values()), f"{domain} {prompt_id}: outputs differ"
            print(f"round {round_ + 1} {domain} {prompt_id}: " + ", ".join(
                f"{name} {runs[(domain, name)][-1]['tokens_per_second']:.1f}" for name in names), flush=True)
    return runs


def summarise(runs: dict[tuple[str, str], list[dict]], drafters: list[str]) -> list[dict]:
    """One row per domain and drafter: median tokens/s beside `none`'s, the median per-request ratio,
    draft tokens per request and the mean accepted length."""
    rows = []
    for domain in DOMAINS:
        none = statistics.median(r["tokens_per_second"] for r in runs[(domain, "none")])
        for name in drafters:
            cell = runs[(domain, name)]
            ratios = [r["tokens_per_second"] / p["tokens_per_second"] for r, p in zip(cell, runs[(domain, "none")])]
            rows.append({
                "domain": domain, "drafter": name, "none_tokens_per_second": none,
                "tokens_per_second": statistics.median(r["tokens_per_second"] for r in cell),
                "ratio": statistics.median(ratios), "ratios": ratios,
                "draft_tokens": sum(r["draft_tokens"] for r in cell) / len(cell),
                "mean_accepted_length": statistics.mean(r["mean_accepted_length"] for r in cell),
            })
    return rows


def report(result: dict) -> str:
    lines = [
        "# Short requests with a costly drafter",
        "",
        f"Machine: {result['machine']}. Model: {result['model']}. Greedy, {result['max_tokens']} new tokens, "
        f"k = {result['k']}; {result['held_out_per_domain']} held-out prompts per domain, each run alone on an "
        f"engine fresh from calibration (as `specdraft generate` runs it), `none` and each drafter interleaved, "
        f"{result['rounds']} rounds. tok/s: median of "
        "the requests' own tokens/s; ratio: median of per-request ratios to `none` in the same round. "
        "Run with `python -m benchmarks.serving.short_requests`.",
        "",
        "| domain | drafter | none tok/s | drafter tok/s | ratio | draft tokens per request | mean accepted length |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['domain']} | {row['drafter']} | {row['none_tokens_per_second']:.1f} | "
                     f"{row['tokens_per_second']:.1f} | {row['ratio']:.2f}x | {row['draft_tokens']:.1f} | "
                     f"{row['mean_accepted_length']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    args = arguments()
    loaded = load_model(None, device=None, dtype="auto")
    names = ["none", *[n.strip() for n in args.drafters.split(",") if n.strip()]]
    engines, fresh = build_engines(loaded, names, args.k)
    prompts = held_out_prompts(loaded.tokenizer, args.held_out)
    params = SamplingParams(max_tokens=args.max_tokens)
    warm = encode_prompt(loaded.tokenizer, "Say hello.")
    for engine in engines.values():
        engine.run([(warm, SamplingParams(max_tokens=8))])
    runs = run_rounds(engines, fresh, names, prompts, params, args.rounds)
    rows = summarise(runs, names[1:])
    result = {"machine": machine(), "model": loaded.name, "max_tokens": args.max_tokens, "k": args.k,
              "rounds": args.rounds, "held_out_per_domain": args.held_out, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(result)
    write_results(args.out, "short_requests", result, text)
    print(text)


if __name__ == "__main__":
    main()
