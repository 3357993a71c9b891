"""The int8 arithmetic's quality against the float32 arithmetic on a model read natively from its GGUF
(`--model`: the embedded SmolLM2-135M-Instruct, Q4_1/Q8_0, by default; or a catalogue name, such as
`qwen2.5-coder-1.5b-instruct`, Q4_K_M), which decides whether `--arithmetic auto` takes int8
(perplexity within 1% of float32's):

- perplexity on a fixed public text of at least 20k tokens: the Lee background corpus (300 news
  articles, as gensim's wheel ships it: `benchmarks.domains.pinned.LEE`), in windows of `--window` tokens,
  every token after a window's first scored; both arithmetics through the compiled CPU step in
  passes of 32 tokens (the passes a verify step runs);
- per domain (code, JSON, prose: `benchmarks.domains.datasets`, a seed the other benchmarks do not use),
  the share of prompts whose first 64 greedy tokens equal float32's, and where they part (a model
  without a chat template, such as `gemma-3-270m`, is given the messages' text).

    python -m benchmarks.cpu.int8_quality [--model NAME] [--tokens 24576] [--prompts 10] [--out benchmarks/results/cpu/int8]
"""

from __future__ import annotations

import math
import os
import time

import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.domains.pinned import LEE, fetch
from specdraft import LLM, SamplingParams
from specdraft.backend import RowModel
from specdraft.backend.numba_layers import MAX_TOKENS
from specdraft.models import load_model
from specdraft.runtime import encode_prompt

ARITHMETICS = ("float32", "int8")
HELD_OUT_SEED = 4343  # prompts no other benchmark draws
GREEDY_TOKENS = 64


def lee_tokens(tokenizer, count: int) -> list[int]:
    """The first `count` tokens of the Lee corpus, its articles joined by blank lines."""
    articles = fetch(LEE).read_text(encoding="utf-8").splitlines()
    ids = tokenizer("\n\n".join(a.strip() for a in articles if a.strip())).input_ids
    if len(ids) < count:
        raise SystemExit(f"the corpus has {len(ids)} tokens, fewer than the {count} asked for")
    return ids[:count]


def perplexity(model: torch.nn.Module, ids: list[int], window: int) -> dict:
    """exp(mean negative log-likelihood) of every token after each window's first, windows of
    `window` tokens fed in passes of `MAX_TOKENS` (the compiled step's passes)."""
    rows = RowModel(model, compiled=True)
    total, scored, start = 0.0, 0, time.perf_counter()
    for begin in range(0, len(ids), window):
        piece = ids[begin : begin + window]
        rows.add("w", active=True)
        for at in range(0, len(piece), MAX_TOKENS):
            chunk = piece[at : at + MAX_TOKENS]
            logits = rows.forward(rows.active_window, [chunk])[0].double()  # [T, vocab]
            rows.commit(rows.active_window, [len(chunk)])
            targets = piece[at + 1 : at + 1 + len(chunk)]
            logprobs = torch.log_softmax(logits[: len(targets)], dim=-1)
            total -= float(logprobs[torch.arange(len(targets)), torch.tensor(targets)].sum())
            scored += len(targets)
        rows.remove("w")
    return {"perplexity": math.exp(total / scored), "scored_tokens": scored, "seconds": time.perf_counter() - start}


def _as_prompt(tokenizer, messages: list[dict]) -> list[dict] | str:
    """The messages, or their text joined where the model has no chat template (a base model: Gemma 3 270M)."""
    return messages if getattr(tokenizer, "chat_template", None) else "\n\n".join(m["content"] for m in messages)


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu" / "int8")
    parser.add_argument("--tokens", type=int, default=24576, help="tokens of the corpus scored (at least 20k)")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--prompts", type=int, default=10, help="prompts per domain for the greedy agreement")
    parser.add_argument("--model", default=None, help="a model `load_model` takes (default: the embedded one)")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    models = {a: load_model(args.model, device="cpu", dtype="float32", arithmetic=a) for a in ARITHMETICS}
    for arithmetic, loaded in models.items():
        assert loaded.arithmetic == arithmetic, f"{arithmetic} asked, {loaded.arithmetic} loaded"
    tokenizer = models["float32"].tokenizer
    ids = lee_tokens(tokenizer, args.tokens)
    scores = {a: perplexity(m.model, ids, args.window) for a, m in models.items()}
    for a, s in scores.items():
        print(f"{a}: perplexity {s['perplexity']:.4f} over {s['scored_tokens']} tokens ({s['seconds']:.0f} s)")

    llms = {a: LLM(m, drafter="none", max_batch=1, prefix_cache_mb=0) for a, m in models.items()}
    params = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0)
    agreement = {}
    for domain in DOMAINS:
        prompts = load_domain(domain, args.prompts, seed=HELD_OUT_SEED)
        rows = []
        for prompt in prompts:
            prompt_ids = encode_prompt(tokenizer, _as_prompt(tokenizer, prompt.messages))
            out = {a: llm.generate(prompt_ids, params)[0].token_ids for a, llm in llms.items()}
            parted = next((i for i, (x, y) in enumerate(zip(out["float32"], out["int8"])) if x != y), None)
            if parted is None and len(out["float32"]) != len(out["int8"]):
                parted = min(len(out["float32"]), len(out["int8"]))
            rows.append({"id": prompt.id, "equal": parted is None, "parted_at": parted,
                         "tokens": [len(out["float32"]), len(out["int8"])]})
        agreement[domain] = {"prompts": rows, "share_equal": sum(r["equal"] for r in rows) / len(rows)}
        print(f"{domain}: {agreement[domain]['share_equal']:.0%} of {len(rows)} prompts equal over "
              f"{GREEDY_TOKENS} greedy tokens")

    ratio = scores["int8"]["perplexity"] / scores["float32"]["perplexity"]
    result = {"machine": machine(), "model": models["float32"].name, "load_at_start": load, "corpus": f"{LEE.package}=={LEE.version}:{LEE.member}",
              "tokens": len(ids), "window": args.window, "perplexity": scores, "int8_over_float32": ratio,
              "within_one_percent": abs(ratio - 1) <= 0.01, "greedy_tokens": GREEDY_TOKENS,
              "held_out_seed": HELD_OUT_SEED, "agreement": agreement}
    write_results(args.out, "quality", result, report(result))


def report(result: dict) -> str:
    p = result["perplexity"]
    lines = [f"# int8 arithmetic: quality against float32 ({result['machine']})", "",
             f"`python -m benchmarks.cpu.int8_quality`: {result.get('model', 'the embedded model')} (its GGUF read "
             "natively), both arithmetics through the compiled CPU step.", "",
             f"Perplexity on the Lee background corpus ({result['corpus']}), {result['tokens']} tokens in windows "
             f"of {result['window']}:", "",
             "| arithmetic | perplexity | tokens scored |", "| --- | --- | --- |"]
    for name in ARITHMETICS:
        lines.append(f"| {name} | {p[name]['perplexity']:.4f} | {p[name]['scored_tokens']} |")
    verdict = "within" if result["within_one_percent"] else "NOT within"
    lines += ["", f"int8 / float32 = {result['int8_over_float32']:.4f}: {verdict} 1%.", "",
              f"Greedy agreement: prompts whose first {result['greedy_tokens']} greedy tokens equal float32's "
              f"(held-out prompts, seed {result['held_out_seed']}):", "",
              "| domain | equal | where the others part (token index) |", "| --- | --- | --- |"]
    for domain, a in result["agreement"].items():
        parted = sorted(r["parted_at"] for r in a["prompts"] if not r["equal"])
        lines.append(f"| {domain} | {a['share_equal']:.0%} of {len(a['prompts'])} | {parted or '-'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
