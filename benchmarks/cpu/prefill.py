"""Prefill on CPU: prompt chunks through the compiled layer stack in calls of 32 tokens (each token
computed as a decode step computes it, so a prefix-cache hit equals a cold run bitwise;
`SPECDRAFT_INVARIANT_PREFILL=1`) against the eager layers (BLAS, the default), on the embedded model,
native weights.

For each prompt length, both ways interleaved round by round (medians); prompt tokens a second, the
ratio, and whether the prompt's last logits equal a token-by-token run's bitwise (only the stack's
calls of 32 tokens can).

    python -m benchmarks.cpu.prefill [--lengths 128,512,2048] [--rounds 5] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.backend.numba_layers import stack as numba_layers
from specdraft.backend.rowmodel import PREFILL_CHUNK, RowModel
from specdraft.models import load_model

WAYS = {True: "stack, calls of 32 tokens", False: "eager layers (BLAS)"}


def prefill(model, prompt: np.ndarray, long_passes: bool, chunk: int = PREFILL_CHUNK) -> tuple[float, torch.Tensor]:
    """(seconds, last logits) of prefilling `prompt` in chunks, long passes run one way or the other."""
    default, numba_layers.LONG_PASSES = numba_layers.LONG_PASSES, long_passes
    try:
        rows = RowModel(model, compiled=True, prefill_chunk=chunk)
        rows.add("r", active=True)
        start = time.perf_counter()
        logits = rows.prefill("r", prompt.tolist())
        return time.perf_counter() - start, logits.clone()
    finally:
        numba_layers.LONG_PASSES = default


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    model = load_model(None, device="cpu", dtype="float32").model
    rng = np.random.default_rng(0)
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "rounds": args.rounds, "threads": torch.get_num_threads(), "lengths": []}
    for length in (int(n) for n in args.lengths.split(",")):
        prompt = rng.integers(0, model.config.vocab_size, size=length)
        _, reference = prefill(model, prompt, True, chunk=1)  # token by token
        times: dict[bool, list[float]] = {True: [], False: []}
        equal = {}
        for _ in range(args.rounds + 1):  # the first round warms up
            for way in (True, False):
                seconds, logits = prefill(model, prompt, way)
                times[way].append(seconds)
                equal[way] = bool(torch.equal(logits, reference))
        row = {"length": length}
        for way in (True, False):
            row[f"{'stack' if way else 'eager'}_tok_s"] = length / statistics.median(times[way][1:])
            row[f"{'stack' if way else 'eager'}_equal_token_by_token"] = equal[way]
        row["ratio"] = row["stack_tok_s"] / row["eager_tok_s"]
        result["lengths"].append(row)
        print(row, flush=True)
    lines = ["# Prefill on CPU: the layer stack in calls of 32 tokens against the eager layers (BLAS)", "",
             f"{result['date']}, {result['machine']}, load {load_before:.2f} before; "
             f"the embedded model, native weights, chunks of {PREFILL_CHUNK}; medians of {args.rounds} interleaved "
             "rounds. Run with `python -m benchmarks.cpu.prefill`.", "",
             "| prompt tokens | stack tok/s | eager (BLAS) tok/s | stack / eager | last logits == token by token (stack, eager) |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['length']} | {r['stack_tok_s']:.0f} | {r['eager_tok_s']:.0f} | {r['ratio']:.2f}x | "
              f"{r['stack_equal_token_by_token']}, {r['eager_equal_token_by_token']} |" for r in result["lengths"]]
    write_results(args.out, "cpu_prefill", result, "\n".join(lines))


if __name__ == "__main__":
    main()
