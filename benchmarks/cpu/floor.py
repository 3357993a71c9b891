"""CPU floor: how close a decode step comes to reading the weights at memory speed.

In one run on this machine, with the threads a step uses:
- read bandwidth: the rate a streaming read reaches (torch's sum over a buffer 16x the last-level
  cache), median of interleaved repeats;
- weight bytes per token, per kind of weights: every weight a decode step reads (each layer's
  projections and MLP, the norms, the output layer; of the embedding, one row): the GGUF's blocks
  (native, the default) or their float32 copy (`--weights dense`);
- each step's floor, bandwidth / its bytes per token, and plain decoding (`none`, batch 1, greedy,
  float32 arithmetic) as a fraction of it: decode-only tokens/s on native weights, on dense ones
  (both by the compiled kernel, `backend/native/`) and on dense ones by numba's loops (the step
  before native weights), interleaved round by round;
- the verify step's cost at k = 0..8 relative to a plain step, each step;
- with one competing busy process: plain decoding per thread setting, each in a fresh process
  (OpenMP reads its waiting policy when it starts), against the same setting on a quiet machine.

    python -m benchmarks.cpu.floor [--rounds 3] [--tokens 128] [--out benchmarks/results/cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results
from specdraft.threads import THREAD_SETTINGS, THREAD_VARIABLES

STEPS = {"native": "native weights (GGUF blocks; the default)", "dense": "dense float32 (`--weights dense`)",
         "numba": "dense float32 by numba's loops (the step before)"}
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]


def read_buffer():
    """A float32 buffer far larger than the caches, for `read_bandwidth`: allocated once a run, not
    once a round (allocating and freeing it, 7.7 GB of pages zeroed and returned right before a
    timed round, slowed that round's decoding by a few percent in ad-hoc runs)."""
    import torch

    return torch.ones(_buffer_bytes() // 4, dtype=torch.float32)


def read_bandwidth(buffer, repeats: int = 7) -> float:
    """Bytes per second a streaming read of `buffer` (a `read_buffer()`) reaches (median)."""
    buffer.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - start)
    return buffer.numel() * 4 / statistics.median(times)


def _buffer_bytes() -> int:
    """16x the last-level cache (at least 512 MiB)."""
    llc = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
            llc = max(llc, int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1))
        except (OSError, ValueError):
            continue
    return max(16 * llc, 512 << 20)


def _stored(module):
    """The tensor a module's weights are read from: its GGUF blocks or its weight."""
    from specdraft.backend.native import BlockEmbedding, BlockLinear

    return module.blocks if isinstance(module, (BlockLinear, BlockEmbedding)) else module.weight


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every parameter and stored block once (tied ones
    once), the input embedding only for its one row unless it is also the output layer."""
    import torch

    seen, total = set(), 0
    embedding, output = _stored(model.get_input_embeddings()), _stored(model.get_output_embeddings())
    for p in [*model.parameters(), *model.buffers()]:
        if p.data_ptr() in seen or not p.dtype.is_floating_point and p.dtype != torch.uint8:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() == embedding.data_ptr() and embedding.data_ptr() != output.data_ptr():
            total += p[0].numel() * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


def decode_rate(llm, tokens: int) -> float:
    """Decode-only tokens/s of one greedy request (from its first token to its last)."""
    from specdraft import SamplingParams, SpeculationParams

    stream = llm.stream(PROMPT, SamplingParams(max_tokens=tokens, ignore_eos=True), SpeculationParams("none"))
    first = next(stream)
    start, produced = time.perf_counter(), 0
    for delta in stream:
        produced += len(delta.token_ids)
    assert produced + len(first.token_ids) == tokens
    return produced / (time.perf_counter() - start)


@contextlib.contextmanager
def built_as(step: str):
    """Build a step of kind `step`: for "numba", float32 layers take numba's loops, as they did
    before the compiled kernel (what int8 draft copies still run)."""
    from specdraft.backend.numba_layers import stack as numba_layers

    kernel = numba_layers.native_kernel
    if step == "numba":
        numba_layers.native_kernel = lambda *args: None
    try:
        yield
    finally:
        numba_layers.native_kernel = kernel


def step_models(native, dense) -> dict:
    """Each step's model: native weights for "native", dense ones (a copy per step: each step's
    layers hold their own weight buffers) otherwise."""
    import copy

    return {step: native.model if step == "native" else (dense.model if step == "dense" else copy.deepcopy(dense.model))
            for step in STEPS}


def plain_llms(native, dense, models: dict) -> dict:
    from specdraft import LLM

    llms = {}
    for step, model in models.items():
        with built_as(step):
            loaded = native if step == "native" else dense
            llms[step] = LLM(dataclasses.replace(loaded, model=model), drafter="none", max_batch=1, prefix_cache_mb=0)
    return llms


def verify_costs(models: dict, rounds: int) -> dict:
    """Step ms at batch 1 for k = 0..8, each step, interleaved (benchmarks.cpu.verify_cost)."""
    from specdraft.params import SamplingParams
    from specdraft.verifier import Verifier

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 1000, size=256).tolist()
    verifiers = {}
    for step, model in models.items():
        with built_as(step):
            verifiers[step] = Verifier(model, compiled=True)
    for verifier in verifiers.values():
        verifier.admit("row0", prompt, SamplingParams())
    cells = {step: [] for step in verifiers}
    for _ in range(rounds):
        for step, verifier in verifiers.items():
            cells[step].append({c["k"]: c["step_ms"] for c in verify_step_times(verifier, 1, list(range(9)), 5, rng)})
    return {step: {k: statistics.median(r[k] for r in runs) for k in range(9)} for step, runs in cells.items()}


def child(setting: str, tokens: int) -> None:
    """One process: plain decoding tokens/s under the thread setting its environment was started with."""
    from specdraft.models import load_model
    from specdraft import LLM

    llm = LLM(load_model(None, device="cpu", dtype="float32"), drafter="none", max_batch=1, prefix_cache_mb=0)
    decode_rate(llm, 16)  # warm: compile (cached on disk), allocations
    print(json.dumps({"setting": setting, "tokens_per_second": statistics.median(decode_rate(llm, tokens) for _ in range(2))}))


def _env(setting: str) -> dict[str, str]:
    """This process's environment with the thread variables left to `setting` alone."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    return {**env, "SPECDRAFT_THREADS": setting, "TRANSFORMERS_VERBOSITY": "error"}


def under_neighbour(rounds: int, tokens: int) -> list[dict]:
    """Plain decoding per thread setting, quiet and beside one busy process, in fresh processes,
    interleaved round by round."""
    runs: dict[tuple[str, bool], list[float]] = {}
    for _ in range(rounds):
        for setting in THREAD_SETTINGS:
            for busy in (False, True):
                neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
                try:
                    out = subprocess.run([sys.executable, "-m", "benchmarks.cpu.floor", "--child", setting,
                                          "--tokens", str(tokens)], capture_output=True, text=True, check=True,
                                         env=_env(setting))
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
                rate = json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_second"]
                runs.setdefault((setting, busy), []).append(rate)
                print(f"  {setting:>8} {'busy' if busy else 'quiet'}: {rate:.1f} tok/s", flush=True)
    rows = []
    for setting in THREAD_SETTINGS:
        quiet, busy = statistics.median(runs[setting, False]), statistics.median(runs[setting, True])
        rows.append({"setting": setting, "env": THREAD_SETTINGS[setting], "quiet": quiet, "busy": busy,
                     "busy_over_quiet": busy / quiet, "quiet_runs": runs[setting, False], "busy_runs": runs[setting, True]})
    return rows


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--skip-neighbour", action="store_true", help="leave out the busy-neighbour runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tokens)
        return

    import torch

    from specdraft.models import load_model

    load_before = os.getloadavg()[0]
    native = load_model(None, device="cpu", dtype="float32")
    dense = load_model(None, device="cpu", dtype="float32", weights="dense")
    assert native.weights == "native", "native weights do not apply here"
    models = step_models(native, dense)
    llms = plain_llms(native, dense, models)
    for llm in llms.values():
        decode_rate(llm, 16)  # warm
    per_token = {step: weight_bytes_per_token(model) for step, model in models.items()}
    bandwidths, rates, buffer = [], {step: [] for step in llms}, read_buffer()
    for r in range(args.rounds):
        bandwidths.append(read_bandwidth(buffer))
        for step, llm in llms.items():
            rates[step].append(decode_rate(llm, args.tokens))
        print(f"round {r + 1}: {bandwidths[-1] / 1e9:.1f} GB/s; "
              + ", ".join(f"{s} {v[-1]:.1f} tok/s" for s, v in rates.items()), flush=True)
    del buffer
    bandwidth = statistics.median(bandwidths)
    plain = {step: {"tokens_per_second": statistics.median(v), "runs": v, "weight_bytes_per_token": per_token[step],
                    "floor_tokens_per_second": bandwidth / per_token[step],
                    "fraction_of_floor": statistics.median(v) / (bandwidth / per_token[step])} for step, v in rates.items()}
    costs = verify_costs(models, args.rounds)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "load_before": load_before,
        "threads": torch.get_num_threads(),
        "thread_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},
        "model": native.name,
        "dtype": "float32 arithmetic",
        "tokens": args.tokens,
        "rounds": args.rounds,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "read_bandwidth_runs_gb_s": [b / 1e9 for b in bandwidths],
        "plain": plain,
        "native_over_dense": plain["native"]["tokens_per_second"] / plain["dense"]["tokens_per_second"],
        "verify_step_ms": costs,
        "neighbour": None if args.skip_neighbour else under_neighbour(args.rounds, args.tokens),
    }
    write(result, args.out)


def write(result: dict, out: Path) -> None:
    plain, costs = result["plain"], result["verify_step_ms"]
    lines = [
        "# CPU floor: plain decoding against the weight-read floor",
        "",
        f"{result['date']}, {result['machine']}; load average {result['load_before']:.2f} at the start. "
        f"{result['model']} ({result['dtype']}), batch 1, greedy, {result['tokens']} tokens, decode only; "
        f"medians of {result['rounds']} interleaved rounds. Run with `python -m benchmarks.cpu.floor`.",
        "",
        f"- read bandwidth (torch's streaming sum over a buffer far larger than the caches, {result['threads']} threads): "
        f"**{result['read_bandwidth_gb_s']:.1f} GB/s** (runs: "
        + ", ".join(f"{b:.1f}" for b in result["read_bandwidth_runs_gb_s"]) + ")",
        f"- native over dense plain decoding: **{result['native_over_dense']:.2f}x**",
        "",
        "| plain decoding (`none`) | weights read per token | its floor | tok/s | of the floor | runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for step, p in plain.items():
        lines.append(f"| {STEPS.get(step, step)} | {p['weight_bytes_per_token'] / 1e6:.0f} MB | "
                     f"{p['floor_tokens_per_second']:.1f} tok/s | {p['tokens_per_second']:.1f} | "
                     f"{100 * p['fraction_of_floor']:.0f}% | " + ", ".join(f"{v:.1f}" for v in p["runs"]) + " |")
    lines += ["", "Verify step at batch 1 (256 tokens of context): ms, and in brackets the ratio to the same "
              "kind's plain step (k = 0):", "", "| k | " + " | ".join(costs) + " |", "| --- |" + " --- |" * len(costs)]
    for k in sorted(next(iter(costs.values())), key=int):
        lines.append(f"| {k} | " + " | ".join(
            f"{costs[s][k]:.1f} ({costs[s][k] / costs[s][min(costs[s], key=int)]:.2f}x)" for s in costs) + " |")
    if result["neighbour"]:
        lines += ["", "Plain decoding (the step as built) quiet and beside one busy process (`python -c 'while True: pass'`), "
                  "each in a fresh process:", "",
                  "| thread setting | environment | quiet tok/s | busy tok/s | busy / quiet |", "| --- | --- | --- | --- | --- |"]
        for row in result["neighbour"]:
            env = " ".join(f"{k}={v}" for k, v in row["env"].items()) or "(torch's defaults)"
            lines.append(f"| {row['setting']} | `{env}` | {row['quiet']:.1f} | {row['busy']:.1f} | "
                         f"{100 * row['busy_over_quiet']:.0f}% |")
    write_results(out, "cpu_floor", result, "\n".join(lines))


if __name__ == "__main__":
    main()
