"""The int8 arithmetic's speed on CPU beside the float32 arithmetic and beside llama.cpp on the same
GGUF file (the embedded SmolLM2-135M-Instruct, Q4_1, or `--model`), in one run, 2 threads, decode only:

- plain decoding: a row fed one token a step from a one-token prompt for 128 steps (llama-bench's
  tg128), tokens per second over the 128 steps;
- a verify pass of 6 tokens (k = 5) against a plain step at the same context (128 tokens), as a ratio;
- a step of 8 rows of one token each against a plain step of one of them (each row's context 128
  tokens), as a ratio;
- prefill: a 512-token prompt in one row (llama-bench's pp512), tokens per second;
- the floor beside them: the rate two threads read a buffer far larger than the caches at
  (`benchmarks.cpu.floor.read_bandwidth`), over the bytes of weights a decode step reads: the
  tokens per second plain decoding would reach if reading the weights were all it did.

Rounds interleave the arithmetics (and llama-bench, where `--llama-bench` names its binary: a
benchmark-only tool, built from the vendor tree of the `llama-cpp-python` sdist, see
`benchmarks/results/cpu/int8/README.md`); medians over rounds. Our figures are the verifier's steps, the
engine's own decode step without its scheduler.

    python -m benchmarks.cpu.int8_speed [--rounds 5] [--llama-bench PATH] [--arithmetics int8]
        [--out benchmarks/results/cpu/int8]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.cpu.floor import read_bandwidth, read_buffer, weight_bytes_per_token
from specdraft.drafters.base import Draft
from specdraft.models import load_model, resolve
from specdraft.params import SamplingParams
from specdraft.verifier import Batch, Verifier

ARITHMETICS = ("float32", "int8")
DECODE, CONTEXT, PREFILL, VERIFY_K, BATCH = 128, 128, 512, 5, 8


def ids_in(verifier: Verifier) -> tuple[int, int]:
    """The token ids the runs draw from: 1000 to 2000, or the upper half of a smaller vocabulary (the kind
    files': `benchmarks.cpu.kind_files`)."""
    high = min(2000, verifier.vocab_size)
    return min(1000, high // 2), high


def decode(verifier: Verifier, rng: np.random.Generator) -> float:
    """tg128: tokens per second of 128 plain steps from a one-token prompt."""
    verifier.admit("decode", [int(rng.integers(*ids_in(verifier)))], SamplingParams())
    start = time.perf_counter()
    for _ in range(DECODE):
        verifier.step(Batch.of(["decode"], [int(rng.integers(*ids_in(verifier)))], [None]))
    seconds = time.perf_counter() - start
    verifier.remove("decode")
    return DECODE / seconds


def step_times(verifier: Verifier, rng: np.random.Generator, rows: int, steps: dict, repeats: int = 15) -> dict:
    """Median seconds of each kind of step, alternating, every row from its own 128-token context and
    back to it after each step. steps: a name -> (the rows stepped, each row's draft length)."""
    ids = [f"row{r}" for r in range(rows)]
    for row in ids:
        verifier.admit(row, rng.integers(*ids_in(verifier), CONTEXT).tolist(), SamplingParams())
    length = verifier.length(ids[0])
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(repeats + 1):
        for name, (stepped, k) in steps.items():
            batch = Batch.of(ids[:stepped], rng.integers(*ids_in(verifier), stepped).tolist(),
                             [Draft(rng.integers(*ids_in(verifier), k).astype(np.int32)) for _ in ids[:stepped]])
            start = time.perf_counter()
            verifier.step(batch)
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - start)
            for row in ids[:stepped]:
                verifier.truncate(row, length)
    for row in ids:
        verifier.remove(row)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def step_ratios(verifier: Verifier, rng: np.random.Generator) -> dict:
    """A 6-token verify pass against a plain step, and a step of 8 rows of one token each against a
    plain step of one of them."""
    t = step_times(verifier, rng, BATCH, {"plain": (1, 0), "verify": (1, VERIFY_K), "batch": (BATCH, 0)})
    return {"plain_ms": t["plain"] * 1e3, "verify_ms": t["verify"] * 1e3, "ratio": t["verify"] / t["plain"],
            "batch_ms": t["batch"] * 1e3, "batch_ratio": t["batch"] / t["plain"]}


def prefill(verifier: Verifier, rng: np.random.Generator) -> float:
    """pp512: tokens per second of one 512-token prompt."""
    start = time.perf_counter()
    verifier.admit("prefill", rng.integers(*ids_in(verifier), PREFILL).tolist(), SamplingParams())
    seconds = time.perf_counter() - start
    verifier.remove("prefill")
    return PREFILL / seconds


def llama_bench(binary: Path, gguf: Path, threads: int) -> dict:
    """llama-bench's pp512, tg128 and a 6-token prompt pass (pp6), tokens per second, 5 repetitions each."""
    out = subprocess.run([str(binary), "-m", str(gguf), "-t", str(threads), "-p", f"{PREFILL},6", "-n", str(DECODE),
                          "-r", "5", "-o", "json"], capture_output=True, text=True, check=True, timeout=900)
    rows = json.loads(out.stdout)
    figures = {}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        figures[name] = row["avg_ts"]
    figures["build"] = rows[0].get("build_commit")
    return figures


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu" / "int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llama-bench", type=Path, default=None, help="llama.cpp's llama-bench binary (optional)")
    parser.add_argument("--model", default=None, help="a GGUF model: a name `specdraft models` lists, or a .gguf "
                        "path (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--arithmetics", default=",".join(ARITHMETICS),
                        help=f"which of ours to run, comma-separated (default: {','.join(ARITHMETICS)})")
    args = parser.parse_args()
    arithmetics = [a for a in ARITHMETICS if a in args.arithmetics.split(",")]
    if not arithmetics:
        parser.error(f"--arithmetics: name at least one of {', '.join(ARITHMETICS)}")

    load = os.getloadavg()[0]
    threads = torch.get_num_threads()
    name, gguf = resolve(args.model)
    verifiers, weight_bytes = {}, 0
    for arithmetic in arithmetics:
        loaded = load_model(args.model, device="cpu", dtype="float32", arithmetic=arithmetic)
        assert loaded.arithmetic == arithmetic, f"{arithmetic} asked, {loaded.arithmetic} loaded"
        verifiers[arithmetic] = Verifier(loaded.model, compiled=True)
        weight_bytes = weight_bytes or weight_bytes_per_token(loaded.model)
    buffer = read_buffer()
    rng = np.random.default_rng(0)
    for verifier in verifiers.values():  # warm-up
        decode(verifier, rng), prefill(verifier, rng)
    rounds: list[dict] = []
    for r in range(args.rounds):
        row: dict = {"floor": {"read_gb_s": read_bandwidth(buffer) / 1e9}}
        for arithmetic, verifier in verifiers.items():
            row[arithmetic] = {"decode_tok_s": decode(verifier, rng), **step_ratios(verifier, rng),
                               "prefill_tok_s": prefill(verifier, rng)}
        if args.llama_bench:
            row["llama.cpp"] = llama_bench(args.llama_bench, gguf, threads)
        rounds.append(row)
        print(json.dumps(row))
    medians = {name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]
                      if key != "build"} for name in rounds[0]}
    result = {"machine": machine(), "kernel_path": os.environ.get("SPECDRAFT_KERNEL_PATH", "native"),
              "model": name, "load_at_start": load, "threads": threads, "rounds": rounds, "medians": medians,
              "weight_bytes_per_token": weight_bytes,
              "llama_bench": str(args.llama_bench) if args.llama_bench else None,
              "llama_cpp_build": rounds[0].get("llama.cpp", {}).get("build")}
    write_results(args.out, "speed", result, report(result))


def report(result: dict) -> str:
    m = result["medians"]
    lines = [f"# int8 arithmetic: speed on CPU, {result.get('model', 'the embedded model')} ({result['machine']}, "
             f"load {result['load_at_start']:.2f} at start)", "",
             f"Medians of {len(result['rounds'])} interleaved rounds: `python -m benchmarks.cpu.int8_speed"
             + (" --llama-bench build/bin/llama-bench`" if result["llama_bench"] else "`"), "",
             f"| | plain decoding, tg128 (tok/s) | 6-token verify pass / plain step | {BATCH} rows of one token / plain step "
             "| prefill, pp512 (tok/s) |",
             "| --- | --- | --- | --- | --- |"]
    floor = m["floor"]["read_gb_s"] * 1e9 / result["weight_bytes_per_token"]
    lines.append(f"| the floor: {m['floor']['read_gb_s']:.1f} GB/s read over {result['weight_bytes_per_token'] / 1e6:.0f} MB "
                 f"a token | {floor:.1f} | | | |")
    for name in ARITHMETICS:
        if name not in m:
            continue
        f = m[name]
        batch = f"{f['batch_ratio']:.2f} ({f['batch_ms']:.2f} ms)" if "batch_ratio" in f else ""
        lines.append(f"| specdraft, {name} arithmetic | {f['decode_tok_s']:.1f} | {f['ratio']:.2f} "
                     f"({f['verify_ms']:.2f} / {f['plain_ms']:.2f} ms) | {batch} | {f['prefill_tok_s']:.0f} |")
    if "llama.cpp" in m:
        f = m["llama.cpp"]
        six, one = 6 / f["pp6"] * 1e3, 1 / f["tg128"] * 1e3
        lines.append(f"| llama.cpp llama-bench ({result['llama_cpp_build']}) | {f['tg128']:.1f} | "
                     f"{six / one:.2f} (pp6 {six:.2f} ms / tg {one:.2f} ms) | | {f['pp512']:.0f} |")
        lines.append("")
        if "int8" in m:
            i8 = m["int8"]
            by_round = sorted(r["int8"]["decode_tok_s"] / r["llama.cpp"]["tg128"] for r in result["rounds"])
            lines.append(f"int8 over llama.cpp: plain decoding {i8['decode_tok_s'] / f['tg128']:.2f}x "
                         f"({by_round[0]:.2f}-{by_round[-1]:.2f}x by round), prefill {i8['prefill_tok_s'] / f['pp512']:.2f}x.")
        lines.append(f"llama.cpp's plain decoding: {f['tg128'] / floor:.0%} of the floor.")
    if "int8" in m:
        lines.append(f"int8's plain decoding: {m['int8']['decode_tok_s'] / floor:.0%} of the floor.")
    if "float32" in m and "int8" in m:
        f32, i8 = m["float32"], m["int8"]
        lines += [f"int8 over float32: plain decoding {i8['decode_tok_s'] / f32['decode_tok_s']:.2f}x, prefill "
                  f"{i8['prefill_tok_s'] / f32['prefill_tok_s']:.2f}x."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
