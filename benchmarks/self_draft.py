"""Training-free self-drafts for the embedded model: which draft made from the target itself drafts
best for its cost?

Candidates: an int8 copy of the target (every linear layer int8, float32 activations: the `model`
drafter's default, `self-int8`); the target's own fp32 layers with m middle layers skipped, the
layers chosen by a greedy calibration on a few prompts (Draft & Verify, Zhang et al. 2023; SWIFT,
Xia et al. 2024); and the int8 copy with the same layers skipped.

Measured, on prompts held out from the calibration: agreement (the share of positions of the
target's own greedy continuations where the draft's argmax is the target's token: the acceptance
of a greedy draft token), the cost of a one-token draft step relative to a target step at batch 1,
and end-to-end tokens/s at batch 1 with the `model` drafter (the engine's cost-aware policy on, and
drafting 3 tokens every step), against plain decoding, with outputs checked against it.

    python -m benchmarks.self_draft [--skips 2,4,8] [--calibration 2] [--held-out 2] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.common import RESULTS, machine, write_results
from benchmarks.datasets import DOMAINS, load_domain
from specdraft import LLM, SamplingParams, SpeculationParams, register
from specdraft.backend import RowModel
from specdraft.drafters.model import ModelDrafter
from specdraft.models import LoadedModel, int8_copy, load_model
from specdraft.runtime import encode_prompt

CANDIDATE = "self-draft-candidate"  # this benchmark's own drafter: the `model` drafter over a candidate


@register(CANDIDATE)
def candidate_drafter(k: int, target: LoadedModel, model: torch.nn.Module, layers: list[int] | None = None,
                      dtype: torch.dtype | None = None) -> ModelDrafter:
    """The `model` drafter over a candidate self-draft: `model`'s `layers` (None: all of them), run in
    `dtype` (None: the weights')."""
    return ModelDrafter(model, k=k, eos_token_ids=target.eos_token_ids, layers=layers, dtype=dtype)


def continuations(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """The target's greedy continuation of each prompt (plain decoding)."""
    llm = LLM(loaded, drafters=["none"], k=0, max_batch=len(prompts), calibrate=False, prefix_cache_mb=0)
    return [(p, out.token_ids) for p, out in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=max_tokens)))]


def agreement(model: torch.nn.Module, layers, dtype, sequences) -> float:
    """Share of continuation positions where the draft's argmax is the target's greedy token."""
    rows = RowModel(model, layers=layers, dtype=dtype)
    hits = total = 0
    for i, (prompt, continuation) in enumerate(sequences):
        rows.add(f"s{i}", active=True)
        ids = np.asarray(prompt + continuation[:-1], dtype=np.int64)[None]
        logits = rows.forward(rows.window_of(f"s{i}"), ids)[0, len(prompt) - 1 :]  # [len(continuation), vocab]
        hits += int((logits.argmax(-1).cpu() == torch.tensor(continuation)).sum())
        total += len(continuation)
        rows.remove(f"s{i}")
    return hits / total


def calibrate_skips(model, dtype, sequences, layers: int, most: int) -> list[tuple[list[int], float]]:
    """Greedy: skip, one at a time, the middle layer whose removal keeps agreement highest."""
    skipped: list[int] = []
    middle = list(range(2, layers - 2))  # the first and last layers stay: skipping them costs most
    found = []
    with tqdm(total=sum(len(middle) - i for i in range(most)), desc="calibrate skips", unit="eval") as bar:
        for _ in range(most):
            scores = {}
            for layer in middle:
                if layer in skipped:
                    continue
                keep = [i for i in range(layers) if i not in skipped and i != layer]
                scores[layer] = agreement(model, keep, dtype, sequences)
                bar.update()
            best = max(scores, key=scores.get)
            skipped.append(best)
            found.append((sorted(skipped), scores[best]))
    return found


def step_seconds(model, layers, dtype, repeats: int = 25) -> float:
    """Median time of a one-token step of one row with a 128-token context."""
    rows = RowModel(model, layers=layers, dtype=dtype, prefill_chunk=128)
    rows.add("r", active=True)
    rows.prefill("r", list(range(3, 131)))
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        rows.forward(rows.active_window, np.array([[5 + i]]))
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


def end_to_end(loaded: LoadedModel, candidate: dict, prompts: list[list[int]], max_tokens: int,
               references: list[list[int]]) -> dict:
    """candidate: the options of `candidate_drafter` (model, layers, dtype)."""
    out = {}
    params = SamplingParams(max_tokens=max_tokens)
    for label, policy, k in (("policy", "auto", 5), ("draft 3 always", "fixed", 3)):
        llm = LLM(loaded, drafters=["none", CANDIDATE], k=k, max_batch=1, policy=policy,
                  drafter_options={CANDIDATE: candidate}, prefix_cache_mb=0)
        tps, ratios, drafted, accepted, same = [], [], 0, 0, True
        for prompt, reference in zip(prompts, references):
            start = time.perf_counter()
            [plain] = llm.generate(prompt, params, SpeculationParams("none"))
            plain_tps = len(plain.token_ids) / (time.perf_counter() - start)
            start = time.perf_counter()
            [done] = llm.generate(prompt, params, SpeculationParams(CANDIDATE))
            tps.append(len(done.token_ids) / (time.perf_counter() - start))
            ratios.append(tps[-1] / plain_tps)
            drafted += done.metrics.draft_tokens
            accepted += done.metrics.accepted_tokens
            same &= done.token_ids == reference == plain.token_ids
        out[label] = {"tokens_per_second": statistics.median(tps), "speedup_vs_none": statistics.median(ratios),
                      "acceptance_rate": accepted / drafted if drafted else None, "draft_tokens": drafted,
                      "identical_to_none": same}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skips", default="2,4,8", help="numbers of skipped layers to report")
    parser.add_argument("--calibration", type=int, default=2, help="calibration prompts per domain")
    parser.add_argument("--held-out", type=int, default=2, help="held-out prompts per domain")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    loaded = load_model(None, device=None, dtype="auto")
    layers = loaded.model.config.num_hidden_layers
    int8 = int8_copy(loaded)
    prompts = {d: load_domain(d, args.calibration + args.held_out) for d in DOMAINS}
    calibration = [encode_prompt(loaded.tokenizer, p.messages) for d in DOMAINS for p in prompts[d][: args.calibration]]
    held_out = [encode_prompt(loaded.tokenizer, p.messages) for d in DOMAINS for p in prompts[d][args.calibration :]]
    cal_sequences = continuations(loaded, calibration, args.max_tokens)
    test_sequences = continuations(loaded, held_out, args.max_tokens)
    skips = sorted(int(s) for s in args.skips.split(","))
    found = calibrate_skips(loaded.model, None, cal_sequences, layers, max(skips))

    target_step = step_seconds(loaded.model, None, None)
    candidates = [("int8 copy (self-int8, the default)", int8.model, None, int8.compute_dtype)]
    for m in skips:
        kept = [i for i in range(layers) if i not in found[m - 1][0]]
        candidates.append((f"fp32, skip {m} layers {found[m - 1][0]}", loaded.model, kept, None))
        candidates.append((f"int8, skip {m} layers", int8.model, kept, int8.compute_dtype))
    rows = []
    for label, model, kept, dtype in tqdm(candidates, desc="candidates", unit="candidate"):
        candidate = {"model": model, "layers": kept, "dtype": dtype}
        rows.append({
            "candidate": label,
            "layers": len(kept) if kept else layers,
            "agreement": agreement(model, kept, dtype, test_sequences),
            "step_cost": step_seconds(model, kept, dtype) / target_step,
            "end_to_end": end_to_end(loaded, candidate, held_out, args.max_tokens, [c for _, c in test_sequences]),
        })
    result = {"machine": machine(), "model": loaded.name, "target_step_ms": 1000 * target_step,
              "max_tokens": args.max_tokens, "calibration_prompts": len(calibration), "held_out_prompts": len(held_out),
              "skip_calibration": [{"skipped": s, "calibration_agreement": a} for s, a in found], "candidates": rows}
    write(result, args.out)
    print((args.out / "self_draft.md").read_text())


def write(result: dict, out: Path) -> None:
    lines = [
        "# Self-drafts for the embedded model",
        "",
        f"Machine: {result['machine']}. Target: {result['model']} (fp32, one-token step {result['target_step_ms']:.1f} ms "
        f"at batch 1). Calibration on {result['calibration_prompts']} prompts, everything else on {result['held_out_prompts']} "
        f"held-out prompts (code, JSON, prose), greedy, {result['max_tokens']} tokens. *Agreement*: share of the target's "
        "greedy tokens the draft's argmax predicts (a greedy draft token's acceptance). *Step cost*: a one-token draft step "
        "over a target step. *End to end*: batch 1, `model` drafter vs plain decoding (median over prompts), with the "
        "engine's cost-aware policy and with 3 draft tokens every step. Run with `python -m benchmarks.self_draft`.",
        "",
        "| candidate | layers | agreement | step cost | policy: tok/s (x none), acceptance | draft 3: tok/s (x none), acceptance | identical |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["candidates"]:
        cells = []
        for label in ("policy", "draft 3 always"):
            e = r["end_to_end"][label]
            acc = "—" if e["acceptance_rate"] is None else f"{e['acceptance_rate']:.2f}"
            cells.append(f"{e['tokens_per_second']:.1f} ({e['speedup_vs_none']:.2f}x), {acc}")
        same = all(r["end_to_end"][x]["identical_to_none"] for x in r["end_to_end"])
        lines.append(f"| {r['candidate']} | {r['layers']} | {r['agreement']:.3f} | {r['step_cost']:.2f} | "
                     + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    lines += ["", "Greedy layer-skip calibration (agreement on the calibration prompts after each added skip):", ""]
    lines += [f"- skip {len(s['skipped'])}: layers {s['skipped']} -> {s['calibration_agreement']:.3f}" for s in result["skip_calibration"]]
    write_results(out, "self_draft", result, "\n".join(lines))


if __name__ == "__main__":
    main()
