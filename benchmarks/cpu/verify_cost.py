"""Verify-step cost on the embedded model: one verifier step for k = 0..8 draft tokens at batch
1, 4, 8, 16, as ratios to a one-token step, and the share of step time spent outside the model
forward (mask building, acceptance, the device-to-host copy, bookkeeping).

    python -m benchmarks.cpu.verify_cost [--quick]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes (a smoke run)")
    parser.add_argument("--context", type=int, default=256, help="tokens already in each row's cache")
    parser.add_argument("--stock", action="store_true",
                        help="the stock Hugging Face layers instead of FewRowsLinear (writes verify_cost_stock.*)")
    args = parser.parse_args()
    batches = [1, 4] if args.quick else [1, 4, 8, 16]
    ks = [0, 1, 4] if args.quick else list(range(9))
    repeats = 3 if args.quick else 15

    loaded = load_model(None, device=None, dtype="auto", few_rows_linears=False if args.stock else None)
    verifier = Verifier(loaded.model)
    rng = np.random.default_rng(0)
    for b in range(max(batches)):
        verifier.admit(f"row{b}", rng.integers(0, 1000, size=args.context).tolist(), SamplingParams())
    # Only the first `batch` rows take part: keep exactly that many in the verifier for each size.
    cells = []
    for batch in sorted(batches, reverse=True):
        while len(verifier.row_ids) > batch:
            verifier.remove(verifier.row_ids[-1])
        for cell in verify_step_times(verifier, batch, ks, repeats, rng):
            cells.append(cell)
            print(json.dumps(cell))
    base = {c["batch"]: c["step_ms"] for c in cells if c["k"] == 0}
    one_token = base[1]
    for c in cells:
        c["ratio_to_k0_same_batch"] = c["step_ms"] / base[c["batch"]]
        c["ratio_to_one_token_step"] = c["step_ms"] / one_token
    result = {
        "machine": machine()
                   + (", FewRowsLinear layers" if loaded.few_rows_linears else ""),
        "model": loaded.name,
        "dtype": str(loaded.model.dtype),
        "context": args.context,
        "repeats": repeats,
        "cells": sorted(cells, key=lambda c: (c["batch"], c["k"])),
    }
    write(result, args.out, "verify_cost_stock" if args.stock else "verify_cost")


def write(result: dict, out: Path, stem: str = "verify_cost") -> None:
    cells = result["cells"]
    batches = sorted({c["batch"] for c in cells})
    ks = sorted({c["k"] for c in cells})
    by = {(c["batch"], c["k"]): c for c in cells}
    lines = [
        "# Verify-step cost",
        "",
        f"Machine: {result['machine']}. Model: {result['model']} ({result['dtype']}). "
        f"Each row holds {result['context']} tokens; median of {result['repeats']} steps per cell, "
        "the ks interleaved within each repeat. Run with `python -m benchmarks.cpu.verify_cost`.",
        "",
        "Step time in ms, and in brackets the ratio to a one-token step (batch 1, k = 0):",
        "",
        "| k | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "| --- | " + " | ".join("---" for _ in batches) + " |",
    ]
    for k in ks:
        row = [f"{by[b, k]['step_ms']:.1f} ({by[b, k]['ratio_to_one_token_step']:.2f}x)" for b in batches]
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    lines += ["", "Share of step time outside the model forward (goal < 5%):", ""]
    lines.append("| k | " + " | ".join(f"batch {b}" for b in batches) + " |")
    lines.append("| --- | " + " | ".join("---" for _ in batches) + " |")
    for k in ks:
        lines.append(f"| {k} | " + " | ".join(f"{100 * by[b, k]['outside_forward_share']:.1f}%" for b in batches) + " |")
    write_results(out, stem, result, "\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in batches:
        ax.plot(ks, [by[b, k]["ratio_to_one_token_step"] for k in ks], marker="o", label=f"batch {b}")
    ax.set_xlabel("draft tokens per row (k)")
    ax.set_ylabel("step time / one-token step")
    ax.set_title("Verify cost, embedded SmolLM2-135M")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)


if __name__ == "__main__":
    main()
