"""Two ways of running the CPU step, A/B in one process on the embedded model in the int8 arithmetic:
a plain step and a 6-token verify pass (k = 5) at several context lengths, both built over the same
weights and their steps interleaved within each round; medians over rounds. `--compare`:

- `attention`: numba's loops against the compiled kernel (`backend/native/csrc/attention.cpp`);
- `zmm`: the kernel's projections in 256-bit registers only (its `ymm` build) against the native
  build, which on AVX-512 reads each 16-row tile whole in 512-bit registers.

    python -m benchmarks.cpu.attention [--compare attention|zmm] [--rounds 40] [--contexts 128 512 1024]
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.drafters.base import Draft
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Batch, Verifier

# Each comparison: its title, and its two variants with what each does to a step's compiled layers.
COMPARISONS = {
    "attention": ("The CPU step's attention: numba's loops against the compiled kernel",
                  {"numba loops": lambda layers: setattr(layers, "attention_address", 0), "kernel": lambda layers: None}),
    "zmm": ("The int8 projections: 256-bit registers only against whole tiles in 512-bit ones",
            {"ymm": lambda layers: layers.use_kernel_build("ymm"), "zmm": lambda layers: None}),
}
K = 5


def step_ms(verifier: Verifier, row: str, k: int, length: int, rng: np.random.Generator) -> float:
    batch = Batch.of([row], [int(rng.integers(1000, 2000))], [Draft(rng.integers(1000, 2000, k).astype(np.int32))])
    start = time.perf_counter()
    verifier.step(batch)
    seconds = time.perf_counter() - start
    verifier.truncate(row, length)
    return seconds * 1e3


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu" / "attention")
    parser.add_argument("--compare", choices=list(COMPARISONS), default="attention")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--arithmetic", default="int8", choices=["int8", "float32"])
    args = parser.parse_args()

    load = os.getloadavg()[0]
    loaded = load_model(None, device="cpu", dtype="float32", arithmetic=args.arithmetic)
    title, variants = COMPARISONS[args.compare]
    verifiers = {}
    for name, setup in variants.items():
        verifier = Verifier(loaded.model, compiled=True)
        layers = verifier.rows.compiled_layers
        assert layers is not None and layers.attention_address != 0, "the compiled kernel did not compile here"
        setup(layers)
        verifiers[name] = verifier
    rng = np.random.default_rng(0)
    cells = []
    for context in args.contexts:
        for name, verifier in verifiers.items():
            verifier.admit(f"c{context}", rng.integers(1000, 2000, context).tolist(), SamplingParams())
        times: dict[tuple[str, int], list[float]] = {(name, k): [] for name in variants for k in (0, K)}
        for r in range(args.rounds + 2):  # two warm-up rounds
            for name, verifier in verifiers.items():
                for k in (0, K):
                    ms = step_ms(verifier, f"c{context}", k, context, rng)
                    if r >= 2:
                        times[(name, k)].append(ms)
        for name, verifier in verifiers.items():
            verifier.remove(f"c{context}")
            plain, verify = statistics.median(times[(name, 0)]), statistics.median(times[(name, K)])
            cells.append({"context": context, "implementation": name, "plain_ms": plain, "verify_ms": verify,
                          "ratio": verify / plain})
    result = {"machine": machine(), "load_at_start": load, "threads": torch.get_num_threads(), "compare": args.compare,
              "title": title, "variants": list(variants), "arithmetic": args.arithmetic, "rounds": args.rounds,
              "cells": cells}
    write_results(args.out, args.compare, result, report(result))


def report(result: dict) -> str:
    before, after = result["variants"]
    lines = [f"# {result['title']} ({result['machine']}, load {result['load_at_start']:.2f} at start)", "",
             f"{result['arithmetic']} arithmetic, the embedded model; medians of {result['rounds']} interleaved rounds: "
             f"`python -m benchmarks.cpu.attention --compare {result['compare']}`", "",
             "| context | variant | plain step (ms) | 6-token verify pass (ms) | verify / plain |",
             "| --- | --- | --- | --- | --- |"]
    cells = result["cells"]
    for c in cells:
        lines.append(f"| {c['context']} | {c['implementation']} | {c['plain_ms']:.2f} | {c['verify_ms']:.2f} | "
                     f"{c['ratio']:.2f} |")
    lines += ["", f"Speedup of {after} over {before} (step time with {before} / with {after}):", "",
              "| context | plain step | 6-token verify pass |", "| --- | --- | --- |"]
    for context in sorted({c["context"] for c in cells}):
        by = {c["implementation"]: c for c in cells if c["context"] == context}
        first, second = by[before], by[after]
        lines.append(f"| {context} | {first['plain_ms'] / second['plain_ms']:.2f}x | "
                     f"{first['verify_ms'] / second['verify_ms']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
