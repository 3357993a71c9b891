"""Where a CPU step's time goes: `torch.profiler` over verifier steps of the embedded model, plain
(k = 0) and verify (k = 5) at batch 1 and 8, for each step of `benchmarks.cpu.floor` (native
weights, dense ones, dense ones by numba's loops), ops grouped by what they do, per step and per
decoder layer.

    python -m benchmarks.cpu.profile_step [--steps 10] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.cpu.floor import built_as, step_models
from specdraft.drafters.base import Draft
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Batch, Verifier

# What each op does, by its profiler name (first matching prefix wins).
GROUPS = [
    ("weights: projections and output layer (BLAS)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")),
    ("weights: compiled kernels (norm, projections, rotary, MLP fused)", ("## Call CompiledFxGraph",)),
    ("numba kernels (weights, norms, rotary, attention, cache writes, MLP: the whole layer stack)",
     ("specdraft::numba",)),
    ("compiled calls: guards and wrappers", ("Torch-Compiled Region", "TorchDynamo Cache Lookup", "AOTDispatcher",
                                             "Pregraph bytecode")),
    ("attention", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
    ("cache writes", ("aten::scatter_",)),
    ("norms, rotary, activation, residual (eager elementwise)",
     ("aten::pow", "aten::mean", "aten::rsqrt", "aten::mul", "aten::add", "aten::silu", "aten::neg", "aten::cat",
      "aten::sum", "aten::div", "aten::sub", "aten::where", "aten::eq", "aten::le", "aten::lt", "aten::ge")),
    ("copies and allocation", ("aten::copy_", "aten::empty", "aten::clone", "aten::repeat", "aten::zeros",
                               "aten::new_zeros", "aten::index_copy", "aten::contiguous", "aten::to", "aten::_to_copy",
                               "aten::zero_", "aten::fill_", "aten::constant_pad_nd", "aten::pad", "aten::stack")),
    ("views and indexing", ("aten::view", "aten::slice", "aten::transpose", "aten::as_strided", "aten::expand",
                            "aten::reshape", "aten::select", "aten::unsqueeze", "aten::permute", "aten::narrow",
                            "aten::unfold", "aten::t", "aten::split", "aten::chunk", "aten::index", "aten::gather",
                            "aten::arange", "aten::_unsafe_view", "aten::alias", "aten::detach", "aten::lift")),
]


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return "other (sampling, acceptance, host bookkeeping)"


def run_case(verifier: Verifier, rows: list[str], k: int, steps: int, rng) -> dict:
    lengths = {r: verifier.length(r) for r in rows}

    def step() -> None:
        verifier.step(Batch.of(rows, [42] * len(rows), [Draft(rng.integers(0, 1000, size=k).astype(np.int32)) for _ in rows]))
        for r in rows:
            verifier.truncate(r, lengths[r])

    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    groups: dict[str, float] = {}
    for e in events:
        groups[group_of(e.key)] = groups.get(group_of(e.key), 0.0) + e.self_cpu_time_total
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return {
        "step_ms": 1000 * statistics.median(times),
        "profiled_step_ms": total / 1000 / steps,
        "groups_ms": {g: v / 1000 / steps for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": e.key[:60], "ms_per_step": e.self_cpu_time_total / 1000 / steps,
                     "calls_per_step": e.count / steps} for e in top],
    }


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    loaded = load_model(None, device="cpu", dtype="float32")
    models = step_models(loaded, load_model(None, device="cpu", dtype="float32", weights="dense"))
    layers = loaded.model.config.num_hidden_layers
    rng = np.random.default_rng(0)
    cases = []
    for kind, model in models.items():
        with built_as(kind):
            verifier = Verifier(model, compiled=True)
        for b in range(8):
            verifier.admit(f"row{b}", rng.integers(0, 1000, size=args.context).tolist(), SamplingParams())
        for batch in (8, 1):  # every active row takes part in a step: keep exactly `batch` of them
            while len(verifier.row_ids) > batch:
                verifier.remove(verifier.row_ids[-1])
            for k in (0, 5):
                case = run_case(verifier, verifier.row_ids, k, args.steps, rng)
                case.update(step=kind, batch=batch, k=k)
                cases.append(case)
                print(f"{kind} batch {batch} k {k}: {case['step_ms']:.1f} ms", flush=True)
    result = {"machine": machine(), "model": loaded.name,
              "layers": layers, "context": args.context, "steps": args.steps, "cases": cases}
    args.out.mkdir(parents=True, exist_ok=True)
    # cpu_profile.md is the hand-written account of these tables
    write_results(args.out, "cpu_profile", result, render(result), markdown_name="cpu_profile_tables")


def render(result: dict) -> str:
    """The measured tables (the report, cpu_profile.md, reads them)."""
    lines = [f"Measured with `python -m benchmarks.cpu.profile_step`: {result['machine']}, {result['model']} (float32), "
             f"{result['context']} tokens of context per row, {result['steps']} steps per case. Self CPU time per "
             f"step from torch.profiler (which adds its own cost per op: the eager step, with ~10x more ops, "
             f"is inflated more), and per decoder layer (/ {result['layers']}).", ""]
    for case in result["cases"]:
        lines += [f"### {case['step']} step, batch {case['batch']}, k = {case['k']}: "
                  f"{case['step_ms']:.1f} ms per step unprofiled ({case['profiled_step_ms']:.1f} ms profiled)", "",
                  "| what | ms per step | ms per layer | share |", "| --- | --- | --- | --- |"]
        total = case["profiled_step_ms"]
        for group, ms in case["groups_ms"].items():
            lines.append(f"| {group} | {ms:.2f} | {ms / result['layers']:.3f} | {100 * ms / total:.0f}% |")
        lines += ["", "Top ops: " + "; ".join(f"`{o['op']}` {o['ms_per_step']:.2f} ms ({o['calls_per_step']:.0f} calls)"
                                              for o in case["top_ops"][:6]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
