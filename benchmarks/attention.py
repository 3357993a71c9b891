"""The CPU step's attention, numba's loops against the compiled kernel (`backend/attention.cpp`), on
the embedded model in the int8 arithmetic: a plain step and a 6-token verify pass (k = 5) at several
context lengths, in one process, the two implementations built over the same weights and their steps
interleaved within each round; medians over rounds.

    python -m benchmarks.attention [--rounds 40] [--contexts 128 512 1024] [--out benchmarks/results/attention]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, machine, write_results
from specdraft.drafters.base import Draft
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier

IMPLEMENTATIONS = ("numba loops", "kernel")
K = 5


def step_ms(verifier: Verifier, row: str, k: int, length: int, rng: np.random.Generator) -> float:
    drafts = {row: Draft(rng.integers(1000, 2000, k).astype(np.int32))} if k else {}
    start = time.perf_counter()
    verifier.step({row: int(rng.integers(1000, 2000))}, drafts)
    seconds = time.perf_counter() - start
    verifier.truncate(row, length)
    return seconds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--arithmetic", default="int8", choices=["int8", "float32"])
    parser.add_argument("--out", type=Path, default=RESULTS / "attention")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    loaded = load_model(None, device="cpu", dtype="float32", arithmetic=args.arithmetic)
    verifiers = {}
    for name in IMPLEMENTATIONS:
        verifier = Verifier(loaded.model, compiled=True)
        layers = verifier.rows.compiled_layers
        assert layers is not None and layers.attention_address != 0, "the attention kernel did not compile here"
        if name == "numba loops":
            layers.attention_address = 0
        verifiers[name] = verifier
    rng = np.random.default_rng(0)
    cells = []
    for context in args.contexts:
        for name, verifier in verifiers.items():
            verifier.admit(f"c{context}", rng.integers(1000, 2000, context).tolist(), SamplingParams())
        times: dict[tuple[str, int], list[float]] = {(name, k): [] for name in IMPLEMENTATIONS for k in (0, K)}
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
    result = {"machine": machine(), "load_at_start": load, "threads": torch.get_num_threads(),
              "arithmetic": args.arithmetic, "rounds": args.rounds, "cells": cells}
    write_results(args.out, "attention", result, report(result))


def report(result: dict) -> str:
    lines = [f"# The CPU step's attention: numba's loops against the compiled kernel ({result['machine']}, "
             f"load {result['load_at_start']:.2f} at start)", "",
             f"{result['arithmetic']} arithmetic, the embedded model; medians of {result['rounds']} interleaved rounds: "
             f"`python -m benchmarks.attention`", "",
             "| context | attention | plain step (ms) | 6-token verify pass (ms) | verify / plain |",
             "| --- | --- | --- | --- | --- |"]
    cells = result["cells"]
    for c in cells:
        lines.append(f"| {c['context']} | {c['implementation']} | {c['plain_ms']:.2f} | {c['verify_ms']:.2f} | "
                     f"{c['ratio']:.2f} |")
    lines += ["", "Speedup of the kernel over numba's loops (step time with the loops / with the kernel):", "",
              "| context | plain step | 6-token verify pass |", "| --- | --- | --- |"]
    for context in sorted({c["context"] for c in cells}):
        by = {c["implementation"]: c for c in cells if c["context"] == context}
        loops, kernel = by["numba loops"], by["kernel"]
        lines.append(f"| {context} | {loops['plain_ms'] / kernel['plain_ms']:.2f}x | "
                     f"{loops['verify_ms'] / kernel['verify_ms']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
