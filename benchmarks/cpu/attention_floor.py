"""How fast an 8000-token prompt can prefill beside a 512-token one on this CPU while attention stays in
float32 (issue 64 asks 0.60x on the embedded model), measured in one process (int8 arithmetic, 2 threads):

- **the machine's float32 rate**: a 2048 x 2048 float32 `torch.mm` (BLAS), GFLOP/s: more than any float32
  attention reaches here (it has a softmax besides its two products, and rows of 64);
- **our attention's rate**: `numba_layers.attend` (the compiled kernel) on a pass of `--chunk` tokens at
  each of `--depths`, the model's heads, over a paged cache as the server holds it; GFLOP/s counting 4 x
  heads x head_dim per (token, entry it sees): its q . k and its weighted values;
- **prefill** of 512 and of 8000 tokens through the verifier (the row model's own passes), alternating,
  `--rounds`, medians: tokens a second and the 8000 / 512 ratio;
- **the ratio's bound**: everything but attention at the 512-token prefill's cost a token (its time less its
  attention at our rate), and attention at the BLAS rate: what the ratio would be with attention as fast as
  this machine multiplies float32 matrices. Where the bound is below the goal, no float32 attention meets it.

    python -m benchmarks.cpu.attention_floor [--rounds 3] [--chunk 256] [--depths 0,2048,4096,7680]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.backend.cache import SPAN
from specdraft.backend.numba_layers import attend
from specdraft.models import load_model
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier

SHORT, LONG = 512, 8000


def median_seconds(run, repeats: int) -> float:
    """The median seconds of `repeats` calls of `run`, after one that warms it up."""
    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def blas_gflops(size: int = 2048, repeats: int = 7) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    return 2 * size**3 / median_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def attention_flops(heads: int, head_dim: int, layers: int, first: int, stop: int) -> float:
    """Multiply-adds x 2 of attention for the tokens at positions [first, stop), each seeing itself and all before."""
    seen = (stop * (stop + 1) - first * (first + 1)) // 2
    return 4.0 * heads * head_dim * layers * seen


def attention_gflops(shape: tuple[int, int, int], depth: int, chunk: int, kernel: int, repeats: int = 5) -> float:
    """Our attention's rate on one layer's pass of `chunk` tokens at positions [depth, depth + chunk)."""
    heads, kv_heads, head_dim = shape
    rng = np.random.default_rng(depth)
    kv = depth + chunk
    spans = -(-kv // SPAN)
    keys, values = (rng.standard_normal((1 + spans, kv_heads, SPAN, head_dim), dtype=np.float32) for _ in range(2))
    table = np.arange(1, 1 + spans, dtype=np.int64)[None, :]  # [1, spans]
    qkv = rng.standard_normal((chunk, (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    positions = np.arange(depth, kv)
    visible = np.arange(kv)[None, :] <= positions[:, None]  # [chunk, kv]
    out = np.empty((chunk, heads * head_dim), np.float32)
    run = lambda: attend(qkv, np.zeros(chunk, np.int64), positions, visible, keys, values, table, heads, kv_heads,  # noqa: E731
                         head_dim, out, kernel, torch.get_num_threads())
    return attention_flops(heads, head_dim, 1, depth, kv) / median_seconds(run, repeats) / 1e9


def prefill_seconds(verifier: Verifier, tokens: int, seed: int) -> float:
    prompt = np.random.default_rng(seed).integers(1000, 2000, tokens).tolist()
    start = time.perf_counter()
    verifier.admit("p", prompt, SamplingParams())
    seconds = time.perf_counter() - start
    verifier.remove("p")
    return seconds


def bound(short_seconds: float, attention_short: float, attention_long: float, ours: float, peak: float) -> dict:
    """The 8000/512 rate ratio with everything but attention at the short prefill's cost a token and attention
    at `peak` GFLOP/s (and, as a check on the model of it, at `ours`)."""
    rest = (short_seconds - attention_short / (ours * 1e9)) / SHORT  # seconds a token, attention aside

    def ratio(rate: float) -> float:
        return (LONG / (LONG * rest + attention_long / (rate * 1e9))) / (SHORT / (SHORT * rest + attention_short / (rate * 1e9)))

    return {"rest_ms_per_token": rest * 1e3, "at_blas_rate": ratio(peak), "at_our_rate": ratio(ours)}


def measure(rounds: int, chunk: int, depths: list[int]) -> dict:
    loaded = load_model(None, device="cpu", dtype="float32", arithmetic="int8")
    verifier = Verifier(loaded.model, compiled=True)
    layers = verifier.rows.compiled_layers
    shape, count = verifier.rows.family.shape, loaded.model.config.num_hidden_layers
    heads, _, head_dim = shape
    peak = blas_gflops()
    ours = {depth: attention_gflops(shape, depth, chunk, layers.attention_address) for depth in depths}
    times: dict[int, list[float]] = {SHORT: [], LONG: []}
    prefill_seconds(verifier, SHORT, 10**6)  # one-off costs out of the figures
    for r in range(rounds):
        for tokens in (SHORT, LONG):
            times[tokens].append(prefill_seconds(verifier, tokens, r * 2 + (tokens == LONG)))
    short, long = (statistics.median(times[n]) for n in (SHORT, LONG))
    a_short, a_long = (attention_flops(heads, head_dim, count, 0, n) for n in (SHORT, LONG))
    # Our rate over the long prompt: its attention weighted by depth, from the depths measured (the deepest's rate beyond).
    rate = statistics.median(ours.values())
    return {"shape": {"heads": heads, "kv_heads": shape[1], "head_dim": head_dim, "layers": count},
            "blas_gflops": peak, "attention_gflops": {str(d): g for d, g in ours.items()},
            "prefill_seconds": {str(n): times[n] for n in times},
            "prefill_tokens_per_second": {str(SHORT): SHORT / short, str(LONG): LONG / long},
            "ratio": (LONG / long) / (SHORT / short),
            "attention_gflop": {str(SHORT): a_short / 1e9, str(LONG): a_long / 1e9},
            "bound": bound(short, a_short, a_long, rate, peak)}


def markdown(result: dict) -> str:
    r, b = result["run"], result["run"]["bound"]
    s = r["shape"]
    rates = ", ".join(f"{g:.0f} at {d}" for d, g in r["attention_gflops"].items())
    return "\n".join([
        "# An 8000-token prefill beside a 512-token one, with float32 attention\n",
        f"{result['date']}, {result['machine']}; load {result['load_before']:.2f} before; "
        f"`python -m benchmarks.cpu.attention_floor {result['command']}`; the embedded model (int8 arithmetic; "
        f"{s['layers']} layers, {s['heads']} heads of {s['head_dim']}, {s['kv_heads']} kv heads).\n",
        "| | figure |", "| --- | --- |",
        f"| prefill, 512 tokens | {r['prefill_tokens_per_second'][str(SHORT)]:.0f} tok/s |",
        f"| prefill, 8000 tokens | {r['prefill_tokens_per_second'][str(LONG)]:.0f} tok/s |",
        f"| **8000 / 512, measured** | **{r['ratio']:.2f}x** |",
        f"| attention's work: 512 / 8000 tokens | {r['attention_gflop'][str(SHORT)]:.0f} / "
        f"{r['attention_gflop'][str(LONG)]:.0f} GFLOP |",
        f"| our attention's rate, a {result['chunk']}-token pass at each depth | {rates} GFLOP/s |",
        f"| float32 `torch.mm` 2048 x 2048 (BLAS) | {r['blas_gflops']:.0f} GFLOP/s |",
        f"| everything but attention, a token | {b['rest_ms_per_token']:.2f} ms |",
        f"| 8000 / 512 modelled at our attention's rate (a check) | {b['at_our_rate']:.2f}x |",
        f"| **8000 / 512 with attention at the BLAS rate** | **{b['at_blas_rate']:.2f}x** |", ""])


def main() -> None:
    parser = cli(__doc__, RESULTS / "serving")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--depths", default="0,2048,4096,7680")
    parser.add_argument("--name", default="attention_floor")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    run = measure(args.rounds, args.chunk, [int(d) for d in args.depths.split(",")])
    command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out")
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "chunk": args.chunk, "command": command, "run": run}
    write_results(args.out, args.name, result, markdown(result))


if __name__ == "__main__":
    main()
