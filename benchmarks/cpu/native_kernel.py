"""Where a native step's time goes: the projections and output layer alone, by weights and pass size.

In one run on this machine, the embedded model's every projection and its output layer as a step
reads them (on 2 MB pages, in step order, all threads), for passes of N tokens: native weights (GGUF
blocks) and dense float32 ones by the compiled kernel (`backend/native/`), and dense ones by
numba's loops (the step before); medians of interleaved rounds, each N's native and dense outputs
checked bitwise equal. Beside them the whole verify step (`Verifier.step`, 256 tokens of context, k =
N - 1), so what is not projections (attention, norms, rotary, sampling, Python) is their difference;
and the kernel's arithmetic rate with the weights in cache (one gate/up projection, one thread),
which says whether a pass is bound by memory or by expanding blocks.

    python -m benchmarks.cpu.native_kernel [--rounds 7] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results

TOKENS = (1, 2, 6, 8, 9, 32)
KINDS = {"native": "native (GGUF blocks, compiled kernel)", "dense": "dense float32 (compiled kernel)",
         "numba": "dense float32 (numba's loops)"}


def _width(weights: tuple) -> int:
    from specdraft.backend import native as blocks

    w, kind = weights[0], weights[3]
    if kind == -1:
        return w.shape[1]
    return w.shape[1] // 4 if kind == blocks.F32 else w.shape[1] // blocks.BLOCK_BYTES[kind] * blocks.BLOCK


def projections_once(sets: dict, n: int, xs: dict, outs: dict) -> None:
    from specdraft.backend.numba_layers import NO_RESIDUAL, project

    weights, kernel = sets
    for i, w in enumerate(weights):
        project(w, xs[_width(w)], outs[i], NO_RESIDUAL, kernel)


def build() -> tuple[dict, dict, object]:
    """The embedded model as each kind of weights (`KINDS`): its verifier, its weights as a step reads
    them with the kernel that reads them, and the compiled kernel."""
    from benchmarks.cpu.floor import built_as, step_models
    from specdraft.backend import native as blocks
    from specdraft.backend.numba_layers import NO_KERNEL, read_parts, step_weights
    from specdraft.models import load_model
    from specdraft.verifier import Verifier

    native = load_model(None, device="cpu", dtype="float32")
    models = step_models(native, load_model(None, device="cpu", dtype="float32", weights="dense"))
    verifiers, sets = {}, {}
    kernel = blocks.kernel()
    for name, model in models.items():
        with built_as(name):
            verifiers[name] = Verifier(model, compiled=True)  # places the weights as a step reads them
        layers = list(model.model.layers)
        sets[name] = (read_parts(step_weights(model, layers, native=name != "numba")),
                      NO_KERNEL if name == "numba" else kernel.calls())
    return verifiers, sets, kernel


def time_projections(sets: dict, rounds: int, rng: np.random.Generator) -> tuple[dict, dict]:
    """N -> ms of every projection a pass of N tokens reads, by kind (medians of interleaved rounds, the
    first dropped), and N -> whether the native and dense outputs are bitwise equal."""
    streamed, equal = {}, {}
    for n in TOKENS:
        xs = {w: rng.standard_normal((n, w)).astype(np.float32) for w in {_width(w) for w in sets["native"][0]}}
        outs = {name: {i: np.empty((n, w[0].shape[0]), np.float32) for i, w in enumerate(s[0])} for name, s in sets.items()}
        times = {name: [] for name in sets}
        for _ in range(rounds + 1):
            for name, s in sets.items():
                start = time.perf_counter()
                projections_once(s, n, xs, outs[name])
                times[name].append(time.perf_counter() - start)
        streamed[n] = {name: 1e3 * statistics.median(t[1:]) for name, t in times.items()}
        equal[n] = all(np.array_equal(outs["native"][i], outs["dense"][i]) for i in outs["native"])
        print(f"N={n}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in streamed[n].items()) + f"; native == dense: {equal[n]}",
              flush=True)
    return streamed, equal


def time_steps(verifiers: dict, rng: np.random.Generator) -> dict:
    """Kind -> N -> ms of the whole verify step of N tokens over 256 tokens of context (median of 3)."""
    from specdraft.params import SamplingParams

    prompt = rng.integers(0, 1000, size=256).tolist()
    for verifier in verifiers.values():
        verifier.admit("row0", prompt, SamplingParams())
    steps = {name: [] for name in verifiers}
    for _ in range(3):
        for name, verifier in verifiers.items():
            steps[name].append({c["k"]: c["step_ms"] for c in verify_step_times(verifier, 1, [n - 1 for n in TOKENS], 5, rng)})
    return {name: {n: statistics.median(r[n - 1] for r in runs) for n in TOKENS} for name, runs in steps.items()}


def time_in_cache(sets: dict, rng: np.random.Generator) -> dict:
    """The first layer's gate/up projection, one thread, enough repeats to read ~200 MB: "kind N=n" ->
    microseconds a call and billions of weights a second. Leaves numba on one thread."""
    import numba

    from specdraft.backend.numba_layers import project

    numba.set_num_threads(1)
    in_cache = {}
    for name, (weights, address) in sets.items():
        gate_up = weights[2]
        for n in (1, 6):
            x = rng.standard_normal((n, _width(gate_up))).astype(np.float32)
            y = np.empty((n, gate_up[0].shape[0]), np.float32)
            repeats = 200
            project(gate_up, x, y, np.zeros((0, 0), np.float32), address)
            start = time.perf_counter()
            for _ in range(repeats):
                project(gate_up, x, y, np.zeros((0, 0), np.float32), address)
            seconds = (time.perf_counter() - start) / repeats
            in_cache[f"{name} N={n}"] = {"us": 1e6 * seconds,
                                         "gweights_per_s": gate_up[0].shape[0] * _width(gate_up) / seconds / 1e9}
    return in_cache


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import torch

    from specdraft.backend.numba_layers import NumbaLayers

    load_before = os.getloadavg()[0]
    verifiers, sets, kernel = build()
    NumbaLayers.use_torch_threads()
    rng = np.random.default_rng(0)
    streamed, equal = time_projections(sets, args.rounds, rng)
    step_ms = time_steps(verifiers, rng)
    in_cache = time_in_cache(sets, rng)
    NumbaLayers.use_torch_threads()
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_before": load_before,
              "threads": torch.get_num_threads(), "rounds": args.rounds, "avx2": kernel.avx2,
              "projections_ms": streamed, "native_equals_dense": equal, "step_ms": step_ms, "in_cache": in_cache}
    write(result, args.out)


def write(result: dict, out: Path) -> None:
    proj, steps = result["projections_ms"], result["step_ms"]
    lines = [
        "# Native weights: where a step's time goes",
        "",
        f"{result['date']}, {result['machine']}; load average {result['load_before']:.2f} at the start; the kernel "
        f"{'with its AVX2 intrinsics' if result['avx2'] else 'as portable loops'}. Run with "
        "`python -m benchmarks.cpu.native_kernel`.",
        "",
        "Every projection and the output layer of the embedded model, as a step reads them, for a pass of N "
        f"tokens (medians of {result['rounds']} interleaved rounds, {result['threads']} threads), and beside each "
        "the whole verify step of that many tokens (256 tokens of context): ms.",
        "",
        "| N | " + " | ".join(f"{KINDS[k]}: projections / step" for k in KINDS) + " | native == dense |",
        "| --- |" + " --- |" * (len(KINDS) + 1),
    ]
    for n in proj:
        lines.append(f"| {n} | " + " | ".join(f"{proj[n][k]:.1f} / {steps[k][n]:.1f}" for k in KINDS)
                     + f" | {'bitwise' if result['native_equals_dense'][n] else 'NO'} |")
    lines += ["", "In cache (one gate/up projection, one thread): " + "; ".join(
        f"{k} {v['us']:.0f} us ({v['gweights_per_s']:.1f} G weights/s)" for k, v in result["in_cache"].items()), ""]
    write_results(out, "native_kernel", result, "\n".join(lines))


if __name__ == "__main__":
    main()
