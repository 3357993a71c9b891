"""What a verify pass's extra tokens cost in the projections, the bulk of a CPU step, and why.

Every projection and the output layer of the embedded model (float32, as a step reads them: on 2 MB
pages, in step order), for passes of N tokens, with each kernel there is for it: ours
(`numba_layers.project`, what a step runs up to `MAX_TOKENS`), torch's `F.linear` (MKL's sgemm),
and MKL's sgemm over weights packed for that N (`torch.ops.mkl._mkl_linear`, what inductor's
freezing uses for float32 linears on CPU). Each is timed two ways:
- *streamed*: all the weights once, from memory (what a step does);
- *in cache*: one gate projection's weights (1536 x 576, 3.5 MB: half per core fits its L2)
  repeated until the same bytes are read: the arithmetic alone, memory out of the way.
If memory and arithmetic overlapped perfectly a streamed pass would take max(streamed N = 1, in
cache N); if they took turns, streamed N = 1 + in cache N - in cache N = 1. The report gives both
bounds next to the measured time. Medians of interleaved rounds.

    python -m benchmarks.cpu.projections [--rounds 7] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, write_results

TOKENS = (1, 2, 3, 6, 9, 16, 32)


def kernels() -> dict:
    """name -> (prepare(weights, n) -> state, run(state, xs) -> None, whether xs are torch tensors)."""
    from specdraft.backend.numba_layers import NO_KERNEL, project

    empty = np.zeros((0, 0), np.float32)

    def ours(state, xs):
        for w, y in state:
            project(w, xs[w[0].shape[1]], y, empty, NO_KERNEL)  # numba's loops

    def linear(state, xs):
        for w in state:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    def packed(state, xs):
        for w, p, n in state:
            torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, n)

    out = {
        "ours (numba)": (lambda ws, n: [(w, np.empty((n, w[0].shape[0]), np.float32)) for w in ws], ours, False),
        "F.linear (MKL)": (lambda ws, n: [torch.from_numpy(w[0]) for w in ws], linear, True),
    }
    if hasattr(torch.ops, "mkl") and hasattr(torch.ops.mkl, "_mkl_linear"):
        out["MKL packed"] = (lambda ws, n: [(t, torch.ops.mkl._mkl_reorder_linear_weight(t, n), n)
                                            for t in (torch.from_numpy(w[0]) for w in ws)], packed, True)
    return out


def timed(run, state, xs) -> float:
    start = time.perf_counter()
    run(state, xs)
    return time.perf_counter() - start


def measure(weights: list[tuple], rounds: int) -> dict:
    total = sum(w[0].nbytes for w in weights)
    gate = weights[2][0][:1536]  # the first layer's gate projection
    hot = (np.ascontiguousarray(gate), weights[2][1][:0], np.zeros(gate.shape[0], np.float32), weights[2][3])
    copies = round(total / hot[0].nbytes)  # the in-cache pass reads as many bytes as the streamed one
    rng = np.random.default_rng(0)
    cells: dict = {}
    for n in TOKENS:  # kernels and places interleaved within each round, so that drift hits them alike
        xs = {w: rng.standard_normal((n, w)).astype(np.float32) for w in {w[0].shape[1] for w in weights}}
        cases = {(name, place): (run, prepare(weights, n) if place == "streamed" else prepare([hot], n) * copies,
                                 {w: torch.from_numpy(x) for w, x in xs.items()} if as_torch else xs)
                 for name, (prepare, run, as_torch) in kernels().items() for place in ("streamed", "in cache")}
        runs: dict = {case: [] for case in cases}
        for _ in range(rounds + 1):
            for case, (run, state, inputs) in cases.items():
                runs[case].append(timed(run, state, inputs))
        for (name, place), v in runs.items():
            cells.setdefault((name, n), {})[place] = statistics.median(v[1:])  # the first round warms
        del cases
        print(f"N={n}: " + "; ".join(f"{name} {1e3 * c['streamed']:.1f} / {1e3 * c['in cache']:.1f} ms"
                                     for (name, m), c in cells.items() if m == n), flush=True)
    out = {}
    for (name, n), cell in cells.items():
        one = cells[(name, 1)]
        out.setdefault(name, []).append({
            "tokens": n,
            "streamed_ms": 1e3 * cell["streamed"],
            "in_cache_ms": 1e3 * cell["in cache"],
            "overlapped_ms": 1e3 * max(one["streamed"], cell["in cache"]),
            "in_turn_ms": 1e3 * (one["streamed"] + cell["in cache"] - one["in cache"]),
            "streamed_gb_s": total / cell["streamed"] / 1e9,
            "in_cache_gflop_s": 2 * n * total / 4 / cell["in cache"] / 1e9,
        })
    return {"weight_bytes": total, "kernels": out}


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from specdraft.backend import RowModel
    from specdraft.backend.numba_layers import NumbaLayers, read_parts, step_weights
    from specdraft.models import load_model

    load_before = os.getloadavg()[0]
    loaded = load_model(None, device="cpu", dtype="float32", weights="dense")
    RowModel(loaded.model, compiled=True)  # the weights where a step reads them (on 2 MB pages, joined)
    NumbaLayers.use_torch_threads()
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "threads": torch.get_num_threads(), "model": loaded.name, "rounds": args.rounds,
              **measure(read_parts(step_weights(loaded.model, list(loaded.model.model.layers))), args.rounds)}
    write(result, args.out)


def write(result: dict, out: Path) -> None:
    lines = [
        "# Projections: what a pass's extra tokens cost, streamed and in cache",
        "",
        f"{result['date']}, {result['machine']}; load average {result['load_before']:.2f} at the start. "
        f"{result['model']} float32: every projection and the output layer, {result['weight_bytes'] / 1e6:.0f} MB; "
        f"medians of {result['rounds']} interleaved rounds. Run with `python -m benchmarks.cpu.projections`.",
        "",
        "*streamed*: all the weights once, from memory, as a step reads them. *in cache*: one 3.5 MB gate "
        "projection repeated to the same bytes (the arithmetic alone). *overlapped* = max(streamed at N = 1, "
        "in cache at N), what the pass would take if memory and arithmetic overlapped perfectly; *in turn* = "
        "streamed at N = 1 + in cache at N - in cache at N = 1, if they took turns. ms.",
        "",
    ]
    for name, rows in result["kernels"].items():
        lines += [f"## {name}", "", "| N | streamed | GB/s | in cache | GFLOP/s | overlapped | in turn |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['tokens']} | {r['streamed_ms']:.1f} | {r['streamed_gb_s']:.1f} | {r['in_cache_ms']:.1f} | "
                  f"{r['in_cache_gflop_s']:.0f} | {r['overlapped_ms']:.1f} | {r['in_turn_ms']:.1f} |" for r in rows]
        lines.append("")
    write_results(out, "projections", result, "\n".join(lines))


if __name__ == "__main__":
    main()
