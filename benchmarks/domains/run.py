"""Per-domain benchmark: specdraft's drafters against Hugging Face's decoding on the same prompts.

For every domain (code, JSON, prose) and prompt, greedy with a fixed token budget, in one run:
specdraft with every registered drafter, Hugging Face `generate` (plain), its prompt lookup (at its
default of 10 tokens and at our k), and its assisted generation when a draft model is given; with
`--llama-cpp DIR`, llama.cpp on the same GGUF files too (plain, prompt lookup, and draft-model
speculation with `--draft-model`: `benchmarks.peers.llama_cpp`), each held to its own plain output.
Methods run interleaved prompt by prompt, so slow drift of the machine hits all of them alike.

    python -m benchmarks.domains.run [--prompts 12] [--max-tokens 128] [--k 5] [--repeats 3] [--out benchmarks/results/domains]
        [--llama-cpp path/to/llama.cpp/build/bin [--llama-cpp-draft-ks 3,5,8,16] [--llama-cpp-ngram ngram-mod]]
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks.peers import hf as peers
from benchmarks.peers import llama_cpp
from benchmarks.common import RESULTS, cli, machine
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.domains.methods import decode_rate
from benchmarks.domains.names import family
from benchmarks.domains.report import write_report
from specdraft import LLM, SamplingParams, SpeculationParams
from specdraft.models import LoadedModel, load_model, resolve
from specdraft.runtime import encode_prompt

HF_PROMPT_LOOKUP_DEFAULT = 10


def near_tie(model, prompt_ids: list[int], reference: list[int], ours: list[int]) -> dict | None:
    """First index where `ours` leaves the reference, and the target's top-2 logit margin there."""
    index = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
    if index is None:
        if len(ours) == len(reference):
            return None
        index = min(len(ours), len(reference))
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + reference[:index]], device=model.device)).logits[0, -1]
    top = logits.float().topk(2).values
    return {"index": index, "margin": float(top[0] - top[1])}


def specdraft_llm(loaded: LoadedModel, k: int, names: list[str], draft_model: str | None,
                  drafter_options: dict | None = None) -> LLM:
    """One engine holding every drafter benchmarked (any registered name, plugins too), assembled as
    the server's is: requests choose their drafter, and the cost-aware policy learns this machine's
    costs across all of them."""
    return LLM(loaded, drafters=names, k=k, max_batch=1, draft_model=draft_model, drafter_options=drafter_options,
               prefix_cache_mb=0)


def run_specdraft(llm: LLM, drafter: str, prompt_ids: list[int], params: SamplingParams) -> dict:
    start = time.perf_counter()
    [done] = llm.generate(prompt_ids, params, SpeculationParams(drafter))
    seconds = time.perf_counter() - start
    m = done.metrics
    return {
        "token_ids": done.token_ids, "tokens": len(done.token_ids), "seconds": seconds,
        "tokens_per_second": len(done.token_ids) / seconds, "time_to_first_token": m.time_to_first_token,
        "decode_tokens_per_second": decode_rate(done), "steps": m.steps,
        "draft_tokens": m.draft_tokens, "accepted_tokens": m.accepted_tokens,
        "accepted_per_step": list(m.accepted_per_step), "per_position_acceptance": m.per_position_acceptance,
        "drafted_at": m.drafted_at.tolist(), "accepted_at": m.accepted_at.tolist(), "draft_seconds": m.draft_seconds,
    }


def step_costs(llm: LLM) -> dict:
    """What the engine's cost model measured by the end of the run (each the median of its last timings,
    `specdraft.policy.costs`): a plain step of one row, T(1, 1), and per costly source a drafted token's
    pass (the tokens it feeds first, its catch-up on the last step's, included) and a token of catch-up
    on steps it sat out (a prompt's among them), each also as a share of the plain step."""
    costs = llm.engine.policy.costs
    plain = costs.verify_seconds(1, 1)
    per_token: dict[str, dict] = {}
    for name, priced, measured in (("draft_token", costs.draft_seconds, costs.drafting),
                                   ("catch_up_token", costs.catch_up_seconds, costs.catch_up)):
        for source in measured:  # the sources it has timings of
            seconds = priced(source, 1)
            per_token.setdefault(source, {}).update({f"{name}_s": seconds, f"{name}_over_plain_step": seconds / plain})
    return {"plain_step_s": plain, "sources": per_token}


def run_repeated(ours: dict, ids: list[int], repeats: int) -> dict[str, dict]:
    """Each of our methods on `ids`, `repeats` rounds interleaved (round r starts at the r-th method, so
    none always follows the same one): each method's run of median speed (the lower middle one for an
    even count: a run that happened), with every run's tok/s (`runs_tokens_per_second`) and whether
    every run gave the same tokens (`same_tokens_every_run`; greedy decoding must)."""
    names = list(ours)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            runs[name].append(ours[name](ids))
    out = {}
    for name, rows in runs.items():
        row = dict(sorted(rows, key=lambda x: x["tokens_per_second"])[(len(rows) - 1) // 2])
        row["runs_tokens_per_second"] = [x["tokens_per_second"] for x in rows]
        row["same_tokens_every_run"] = all(x["token_ids"] == rows[0]["token_ids"] for x in rows)
        out[name] = row
    return out


def repeat_slow_prompts(cells: dict, prompts: dict, ours: dict, tokenizer, times: int) -> list[dict]:
    """Prompts where ngram ran more than 3% slower than none: run both `times` more times, interleaved,
    so the report can tell noise from a real loss (median ratio over all runs)."""
    if "specdraft-ngram" not in ours or "specdraft-none" not in ours or times <= 0:
        return []
    out = []
    for domain, domain_prompts in prompts.items():
        none_rows = {r["id"]: r for r in cells.get((domain, "specdraft-none"), [])}
        for row in cells.get((domain, "specdraft-ngram"), []):
            plain = none_rows.get(row["id"])
            if plain is None or row["tokens_per_second"] >= 0.97 * plain["tokens_per_second"]:
                continue
            prompt = next(p for p in domain_prompts if p.id == row["id"])
            ids = encode_prompt(tokenizer, prompt.messages)
            ratios = [row["tokens_per_second"] / plain["tokens_per_second"]]
            for _ in range(times):
                a, b = ours["specdraft-none"](ids), ours["specdraft-ngram"](ids)
                ratios.append(b["tokens_per_second"] / a["tokens_per_second"])
            out.append({"domain": domain, "id": row["id"], "ratios": ratios, "median_ratio": statistics.median(ratios)})
    return out


def over_variant(cells: dict, names: list[str], variant: str, ours: str, theirs: str) -> list[dict]:
    """Per domain and drafter: median tok/s of `specdraft-<name>` over `specdraft-<name>-<variant>`
    (dense weights, or the float32 arithmetic), prompt by prompt (the two ran the same prompt back to
    back), and each one's median tok/s under the keys `ours`_tok_s and `theirs`_tok_s."""
    out = []
    for (domain, method), rows in cells.items():
        name = method.removeprefix("specdraft-")
        if name not in names or (domain, f"{method}-{variant}") not in cells:
            continue
        other = {r["id"]: r for r in cells[(domain, f"{method}-{variant}")]}
        ratios = [r["tokens_per_second"] / other[r["id"]]["tokens_per_second"] for r in rows if r["id"] in other]
        out.append({"domain": domain, "drafter": name, "median_ratio": statistics.median(ratios),
                    f"{ours}_tok_s": statistics.median(r["tokens_per_second"] for r in rows),
                    f"{theirs}_tok_s": statistics.median(r["tokens_per_second"] for r in other.values())})
    return out


def run_hf(fn, *args, **kwargs) -> dict:
    result = fn(*args, **kwargs)
    return {"token_ids": list(result.token_ids), "tokens": len(result.token_ids), "seconds": result.seconds,
            "tokens_per_second": result.tokens_per_second}


def arguments():
    parser = cli(__doc__, RESULTS / "domains")
    parser.add_argument("--prompts", type=int, default=12, help="prompts per domain")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("-k", "--k", type=int, default=5, help="our draft length (and HF prompt lookup's second setting)")
    parser.add_argument("--domains", default=",".join(DOMAINS))
    parser.add_argument("--model", default=None, help="target (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft-model", default=None, help="draft model for specdraft's model/hybrid drafters and HF "
                        "assisted generation (default: the model drafter's int8 copy of the target; no HF assisted run)")
    parser.add_argument("--drafters", default="none,ngram,model,hybrid",
                        help="specdraft drafters to run: any registered name, plugins included (`specdraft drafters`)")
    parser.add_argument("--drafter-options", type=json.loads, default=None,
                        help='each drafter\'s options by name, as JSON: \'{"ngram": {"max_n": 4}}\'')
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each specdraft method this many times per prompt, interleaved, and keep the "
                             "run of median speed (this machine's speed moves by a fifth between runs)")
    parser.add_argument("--repeat-slow", type=int, default=3,
                        help="re-run none and ngram this many times on a prompt where ngram looked slower (noise or loss?)")
    parser.add_argument("--dense", action="store_true",
                        help="also run each specdraft drafter on the model's dense float32 weights (`--weights "
                             "dense`; methods `specdraft-<name>-dense`), interleaved, beside its native weights")
    parser.add_argument("--arithmetic", default="auto", choices=("auto", "int8", "float32"),
                        help="what specdraft's native weights compute in (auto: int8 where they load)")
    parser.add_argument("--no-peers", action="store_true",
                        help="leave the Hugging Face peers out (for a model whose stock float32 copy is slow or "
                             "large): every specdraft method is then held to specdraft-none's output")
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="a folder holding llama.cpp's llama-lookup and llama-speculative (a benchmark-only "
                             "build): run llama.cpp on the same GGUF files too")
    parser.add_argument("--llama-cpp-draft-ks", type=lambda v: tuple(int(n) for n in v.split(",") if n), default=(),
                        help="with --llama-cpp and --draft-model: llama.cpp's speculation tuned too, at each of these "
                             "draft lengths (comma-separated, e.g. 3,5,8,16), `--spec-type draft-simple`")
    parser.add_argument("--llama-cpp-p-min", type=float, default=0.75,
                        help="the tuned speculation's `--spec-draft-p-min` (default 0.75)")
    parser.add_argument("--llama-cpp-ngram", type=lambda v: tuple(t for t in v.split(",") if t), default=(),
                        help="with --llama-cpp: llama.cpp's other n-gram drafters too, by `--spec-type` (comma-separated, "
                             "e.g. ngram-mod,ngram-map-k; `llama-speculative-simple`, built beside the others)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (specdraft's methods alone: --no-peers), every request "
                             "with the same --seed, so that every method draws the same numbers and its output "
                             "must equal specdraft-none's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--float32", action="store_true",
                        help="also run each specdraft drafter in the float32 arithmetic (methods "
                             "`specdraft-<name>-float32`), interleaved, beside the int8 one")
    args = parser.parse_args()
    if args.temperature and (not args.no_peers or args.llama_cpp):
        parser.error("--temperature above 0 runs specdraft alone (add --no-peers, leave out --llama-cpp): "
                     "the peers here decode greedily")
    return args


def sampling(args) -> SamplingParams:
    """Every specdraft request's parameters: greedy, or at --temperature with --seed."""
    if not args.temperature:
        return SamplingParams(max_tokens=args.max_tokens)
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)


def our_methods(args, loaded: LoadedModel, names: list[str]) -> tuple[list[str], dict, list, dict]:
    """The drafters that built (a plugin that failed is left out), specdraft's methods by name (each drafter, and again on every `--dense` / `--float32` load of
    the model), their engines, and each method's lossless reference: the plain decoding of its
    arithmetic (Hugging Face `generate`'s for float32, specdraft-none's for int8, which no peer computes)."""
    llm = specdraft_llm(loaded, args.k, names, args.draft_model, args.drafter_options)
    for name, why in llm.runtime.skipped.items():  # a plugin that failed to build: the others run
        print(f"benchmark: drafter {name!r} is left out: {why}", file=sys.stderr)
    names = [n for n in names if n not in llm.runtime.skipped]
    params = sampling(args)
    ours = {f"specdraft-{n}": (lambda ids, n=n: run_specdraft(llm, n, ids, params)) for n in names}
    llms = [llm]
    variants = [("dense", {"weights": "dense"})] * args.dense + [("float32", {"arithmetic": "float32"})] * args.float32
    for suffix, options in variants:  # each drafter again on another load of the model, beside the first
        other = specdraft_llm(load_model(args.model, device=loaded.model.device, dtype="auto", **options), args.k,
                              names, args.draft_model, args.drafter_options)
        llms.append(other)
        ours.update({f"specdraft-{n}-{suffix}": (lambda ids, n=n, e=other: run_specdraft(e, n, ids, params))
                     for n in names})
    int8_reference = "specdraft-none" if loaded.arithmetic == "int8" and "none" in names else "hf-generate"
    reference_of = {m: int8_reference if m.startswith("specdraft-") and not m.endswith(("-dense", "-float32"))
                    else "hf-generate" for m in ours}
    return names, ours, llms, reference_of


def hf_methods(args, stock: LoadedModel) -> dict:
    """The Hugging Face peers by name, on the stock model (and `--draft-model` for assisted generation)."""
    eos = stock.eos_token_ids
    methods = {
        "hf-generate": lambda ids: run_hf(peers.hf_generate, stock.model, ids, args.max_tokens, eos),
        f"hf-prompt-lookup-k{HF_PROMPT_LOOKUP_DEFAULT}": lambda ids: run_hf(
            peers.hf_prompt_lookup, stock.model, ids, args.max_tokens, eos, num_tokens=HF_PROMPT_LOOKUP_DEFAULT),
        f"hf-prompt-lookup-k{args.k}": lambda ids: run_hf(
            peers.hf_prompt_lookup, stock.model, ids, args.max_tokens, eos, num_tokens=args.k),
    }
    if args.draft_model:
        assistant = load_model(args.draft_model, device=stock.model.device, dtype="auto", few_rows_linears=False,
                               weights="dense").model
        methods["hf-assisted"] = lambda ids: run_hf(peers.hf_assisted, stock.model, assistant, ids, args.max_tokens, eos)
    return methods


def llama_cpp_methods(args, loaded: LoadedModel) -> dict:
    """llama.cpp's methods by name on the model's GGUF file (and `--draft-model`'s), on our threads."""
    target = resolve(args.model)[1]
    draft = resolve(args.draft_model)[1] if args.draft_model else None
    for path in (target, draft):
        if path is not None and Path(path).suffix != ".gguf":
            raise SystemExit(f"--llama-cpp needs GGUF files, got {path}")
    threads = torch.get_num_threads()

    def prompt(ids: list[int]) -> str:
        return loaded.tokenizer.decode(ids, skip_special_tokens=False)

    return {name: (lambda ids, argv=argv: llama_cpp.run(argv, prompt(ids), args.max_tokens, threads, loaded.tokenizer))
            for name, argv in llama_cpp.methods(args.llama_cpp, Path(target), draft and Path(draft), args.k,
                                                 args.llama_cpp_draft_ks, args.llama_cpp_p_min,
                                                 args.llama_cpp_ngram).items()}


def run_prompts(prompts: dict, ours: dict, theirs: dict, reference_of: dict, loaded: LoadedModel,
                stock: LoadedModel, repeats: int) -> dict[tuple[str, str], list[dict]]:
    """Every method on every prompt, interleaved prompt by prompt: (domain, method) -> per-prompt rows,
    each with whether its output equals its reference's (and where it parted, if not)."""
    cells: dict[tuple[str, str], list[dict]] = {}
    total = sum(len(p) for p in prompts.values()) * (len(ours) * repeats + len(theirs))
    with tqdm(total=total, desc="benchmark", unit="run") as bar:
        for domain, domain_prompts in prompts.items():
            for prompt in domain_prompts:
                ids = encode_prompt(loaded.tokenizer, prompt.messages)
                bar.set_postfix_str(f"{domain} {prompt.id}")
                rows = {method: fn(ids) for method, fn in theirs.items()}
                rows.update(run_repeated(ours, ids, repeats))
                outputs: dict[str, list[int]] = {}
                for method, row in rows.items():
                    outputs[method] = row["token_ids"]
                    reference = outputs[reference_of.get(method, "hf-generate")]
                    row["lossless"] = row["token_ids"] == reference and row.get("same_tokens_every_run", True)
                    if not row["lossless"] and not method.startswith(llama_cpp.PREFIX):  # its logits are not ours
                        row["divergence"] = near_tie(stock.model, ids, reference, row["token_ids"])
                    row["id"] = prompt.id
                    row["source"] = prompt.source
                    del row["token_ids"]
                    cells.setdefault((domain, method), []).append(row)
                    bar.update(repeats if method in ours else 1)
    return cells


def main() -> None:
    args = arguments()
    loaded = load_model(args.model, device=None, dtype="auto", arithmetic=args.arithmetic)
    # The peers run the stock Hugging Face model, as their users would; ours runs it as specdraft loads it.
    stock = load_model(args.model, device=loaded.model.device, dtype="auto", few_rows_linears=False,
                       weights="dense") if loaded.few_rows_linears and not args.no_peers else loaded
    asked = [n.strip() for n in args.drafters.split(",") if n.strip()]
    names, ours, llms, reference_of = our_methods(args, loaded, asked)
    theirs = {} if args.no_peers else hf_methods(args, stock)
    if args.no_peers:  # no hf-generate to hold float32 outputs to: plain decoding is every method's reference
        reference_of = {method: "specdraft-none" for method in reference_of}
    if args.llama_cpp:  # each held to llama.cpp's own plain decoding
        found = llama_cpp_methods(args, loaded)
        theirs.update(found)
        reference_of.update({name: llama_cpp.PLAIN for name in found})

    # Warm-up: first calls pay one-off allocation and kernel selection costs.
    warm = encode_prompt(loaded.tokenizer, "Say hello.")
    for name in names:
        for engine in llms:
            run_specdraft(engine, name, warm, SamplingParams(max_tokens=8))
    for fn in theirs.values():
        fn(warm)

    domains = [d.strip() for d in args.domains.split(",") if d.strip()]
    prompts = {d: load_domain(d, args.prompts) for d in domains}
    cells = run_prompts(prompts, ours, theirs, reference_of, loaded, stock, args.repeats)
    repeats = repeat_slow_prompts(cells, prompts, ours, loaded.tokenizer, args.repeat_slow)
    results = {
        "machine": machine(),
        "repeats": repeats,
        "model": loaded.name,
        "weights": loaded.weights,  # specdraft-<name>'s; specdraft-<name>-dense: "dense"
        "arithmetic": loaded.arithmetic,  # specdraft-<name>'s; specdraft-<name>-float32: "float32"
        "lossless_reference": reference_of,  # each specdraft method's: the plain decoding of its arithmetic
        "native_over_dense": over_variant(cells, names, "dense", "native", "dense"),
        "int8_over_float32": over_variant(cells, names, "float32", "int8", "float32"),
        "setup": ("specdraft alone (--no-peers: no Hugging Face method ran)" if args.no_peers else
                  "specdraft runs the model with its FewRowsLinear layers (fast skinny products on CPU); "
                  "Hugging Face's methods run the stock model" if loaded.few_rows_linears
                  else "specdraft and Hugging Face run the same stock model"),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed if args.temperature else None,
        "k": args.k,
        "runs_per_prompt": args.repeats,  # specdraft's methods; each prompt's row is its run of median speed
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "prompts_per_domain": args.prompts,
        "step_costs": step_costs(llms[0]),
        "cells": [
            {"domain": d, "method": m, "family": family(m), "prompts": rows}
            for (d, m), rows in cells.items()
        ],
    }
    write_report(results, args.out)
    print(f"wrote {args.out}/results.md")


if __name__ == "__main__":
    main()
