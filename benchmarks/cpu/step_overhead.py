"""Where a CPU verify step's time goes around the compiled kernels: the embedded model in the int8
arithmetic, one row at a 128-token context, a plain step and a 6-token verify pass (k = 5)
alternating, each layer of the call timed from outside:

- kernels: numba's layer stack and output head (`numba_layers._stack`, `_head`), the arithmetic;
- layer wrappers: `NumbaLayers.stack` and `head` less the kernels (tensor views, the cache's typed
  lists, thread counts);
- forward: `RowModel.packed_pass` less the layers (positions, the mask, the embedding, the rotary
  embedding, the cache's preparation);
- verifier: `Verifier.step` less the forward (acceptance, commit, results).

Everything but the kernels is Python and host tensors, the same whatever the pass's width: the part
of a plain step that speculation does not multiply. Medians over rounds.

    python -m benchmarks.cpu.step_overhead [--model NAME] [--rounds 300] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import numpy as np

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.backend import rowmodel
from specdraft.backend.numba_layers import stack as numba_layers
from specdraft.drafters.base import Draft
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Batch, Verifier, verifier

CONTEXT, K = 128, 5
TIMED = {"kernels": [(numba_layers, "_stack"), (numba_layers, "_head")],
         "layer calls": [(numba_layers.NumbaLayers, "stack"), (numba_layers.NumbaLayers, "head")],
         "forward": [(rowmodel.RowModel, "packed_pass")],
         "verifier step": [(verifier.Verifier, "step")]}
PARTS = ("kernels", "layer wrappers", "forward", "verifier")


@contextmanager
def timed(seconds: dict[str, float]):
    """Each TIMED function wrapped to add its time to seconds[its group] while the block runs."""
    saved = []
    for group, targets in TIMED.items():
        for owner, name in targets:
            original = getattr(owner, name)
            saved.append((owner, name, original))

            def wrapper(*args, _original=original, _group=group, **kwargs):
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    seconds[_group] += time.perf_counter() - start
            setattr(owner, name, wrapper)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def measure(rounds: int, model_name: str | None = None) -> dict:
    model = load_model(model_name, device="cpu", dtype="float32", arithmetic="int8").model
    target = Verifier(model, compiled=True)
    rng = np.random.default_rng(0)
    target.admit("r", rng.integers(1000, 2000, CONTEXT).tolist(), SamplingParams())
    length = target.length("r")
    parts: dict[int, dict[str, list[float]]] = {0: defaultdict(list), K: defaultdict(list)}
    for r in range(rounds + 3):
        for k in parts:
            seconds: dict[str, float] = defaultdict(float)
            batch = Batch.of(["r"], [int(rng.integers(1000, 2000))], [Draft(rng.integers(1000, 2000, k).astype(np.int32))])
            with timed(seconds):
                target.step(batch)
            target.truncate("r", length)
            if r < 3:  # warm-up
                continue
            split = {"kernels": seconds["kernels"], "layer wrappers": seconds["layer calls"] - seconds["kernels"],
                     "forward": seconds["forward"] - seconds["layer calls"],
                     "verifier": seconds["verifier step"] - seconds["forward"], "step": seconds["verifier step"]}
            for name, value in split.items():
                parts[k][name].append(value)
    return {("plain" if k == 0 else f"verify {k + 1} tokens"): {name: statistics.median(v) * 1e3 for name, v in p.items()}
            for k, p in parts.items()}


def report(result: dict) -> str:
    lines = [f"# A CPU verify step around its kernels ({result['machine']}, load {result['load_at_start']:.2f} at start)",
             "", f"Medians of {result['rounds']} alternating rounds, int8 arithmetic, {CONTEXT}-token context: "
             "`python -m benchmarks.cpu.step_overhead`", "",
             "| step | " + " | ".join(PARTS) + " | whole step | outside the kernels |",
             "| --- | " + " | ".join("---" for _ in PARTS) + " | --- | --- |"]
    for step, p in result["steps"].items():
        outside = p["step"] - p["kernels"]
        lines.append(f"| {step} | " + " | ".join(f"{p[name]:.3f} ms" for name in PARTS)
                     + f" | {p['step']:.3f} ms | {outside:.3f} ms ({outside / p['step']:.0%}) |")
    return "\n".join(lines)


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--model", default=None, help="a model `load_model` takes (default: the embedded one)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    result = {"machine": machine(), "load_at_start": load, "rounds": args.rounds,
              "model": args.model or "the embedded model", "steps": measure(args.rounds, args.model)}
    write_results(args.out, "step_overhead", result, report(result))
    print(report(result))


if __name__ == "__main__":
    main()
