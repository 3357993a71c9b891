"""Tilings of the batch-invariant linear (`specdraft.backend.triton_kernels.linear`) on a GPU: for the
weight shapes of Llama-3.2-1B/-3B, each candidate tiling's time for a decode (1 row) and a verify
pass (6 rows), the bandwidth it reaches, and two checks: row 0 of the 6-row product equals the 1-row
product bitwise (the tiling is row-invariant), and the product is within bf16 rounding of torch's.
Each time is a CUDA graph of `CALLS` calls replayed, so launch gaps count as they do in a step.

    python -m benchmarks.gpu.kernels [--out benchmarks/results/gpu]
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from benchmarks.common import RESULTS, cli
from specdraft.backend import triton_kernels as tk

SHAPES = {  # name -> (out, in), Llama-3.2 1B and 3B
    "1b qkv": (3072, 2048), "1b o": (2048, 2048), "1b gate_up": (16384, 2048), "1b down": (2048, 8192),
    "1b lm_head": (128256, 2048), "3b qkv": (5120, 3072), "3b down": (3072, 8192),
}
CANDIDATES = [  # (block_o, block_k, stages, target programs)
    (64, 64, 3, 128), (64, 128, 3, 128), (64, 128, 4, 264), (32, 128, 4, 264), (128, 64, 4, 264),
    (64, 256, 3, 264), (32, 256, 3, 528), (32, 64, 4, 528), (64, 128, 4, 528), (128, 128, 3, 264),
]
CALLS = 20


def time_graph(fn, repeats: int = 5) -> float:
    """Seconds per call of `fn`, from a CUDA graph of CALLS calls replayed `repeats` times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / CALLS)
    return statistics.median(times)


def main() -> None:
    parser = cli(__doc__, RESULTS / "gpu")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    results = []
    for name, (n_out, n_in) in SHAPES.items():
        weight = (torch.randn(n_out, n_in, device="cuda") / n_in ** 0.5).to(torch.bfloat16)
        x = torch.randn(6, n_in, device="cuda").to(torch.bfloat16)
        reference = (x.float() @ weight.float().T)
        for block_o, block_k, stages, target in CANDIDATES:
            tiled = tk.tiling(n_out, n_in, target, block_o, block_k, 4, stages)
            row = {"shape": name, "out": n_out, "in": n_in, "block_o": block_o, "block_k": block_k, "stages": stages,
                   "target": target, "splits": tiled.splits}
            try:
                one = tk.linear(x[:1], weight, tiled=tiled)
                six = tk.linear(x, weight, tiled=tiled)
                row["row_invariant"] = bool(torch.equal(one[0], six[0]))
                row["max_error"] = float((six.float() - reference).abs().max() / reference.abs().max())
                for rows in (1, 6):
                    seconds = time_graph(lambda: tk.linear(x[:rows], weight, tiled=tiled))
                    row[f"us_{rows}"] = 1e6 * seconds
                    row[f"gb_s_{rows}"] = weight.numel() * 2 / seconds / 1e9
            except Exception as exc:  # a tiling that does not compile here is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            results.append(row)
            print(json.dumps(row), flush=True)
        del weight
    (args.out / "gpu_kernels.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["# Batch-invariant linear tilings on the GPU", "",
             "| shape | block_o | block_k | stages | target | splits | 1 row µs | GB/s | 6 rows µs | GB/s | row-invariant | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['block_o']} | {r['block_k']} | {r['stages']} | {r['target']} | "
                         f"{r['splits']} | — | — | — | — | — | {r['error']} |")
        else:
            lines.append(f"| {r['shape']} | {r['block_o']} | {r['block_k']} | {r['stages']} | {r['target']} | "
                         f"{r['splits']} | {r['us_1']:.1f} | {r['gb_s_1']:.0f} | {r['us_6']:.1f} | {r['gb_s_6']:.0f} | "
                         f"{r['row_invariant']} | {r['max_error']:.1e} |")
    (args.out / "gpu_kernels.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
