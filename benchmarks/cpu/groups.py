"""Where a native model's CPU step reads its weights: every projection group as the compiled step reads it
(q/k/v joined, output, gate/up joined, down, the output layer), timed alone at one token and at six,
grouped by role and by the kind it is read as (its GGUF block kind, or F32 where a group's linears
have blocks of different kinds and the step reads it dense), with its bytes and the rate it reads
them at; beside them the whole verify step. Medians of interleaved rounds (each round: every group
in step order, as a step reads them).

    python -m benchmarks.cpu.groups --model qwen2.5-coder-1.5b-instruct [--arithmetic int8] [--rounds 7]
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results

ROLES = ("q/k/v", "attention output", "gate/up", "down")
TOKENS = (1, 6)


def build(model_name: str | None, arithmetic: str):
    """The model's verifier (which places the weights as its step reads them), its projections' weights
    in step order with their roles, and the compiled kernel's calls for the arithmetic."""
    from specdraft.backend import native
    from specdraft.backend.numba_layers import read_parts, step_weights
    from specdraft.models import load_model
    from specdraft.verifier import Verifier

    loaded = load_model(model_name, device="cpu", dtype="float32", arithmetic=arithmetic)
    verifier = Verifier(loaded.model, compiled=True)
    layers = list(loaded.model.model.layers)
    weights = step_weights(loaded.model, layers, native=True)
    groups = []  # (role, part) in step order: a q/k/v pair gives one or two parts
    for i in range(len(layers)):
        qkv, *rest = weights[4 * i : 4 * i + 4]
        groups += [("q/k/v", part) for part in read_parts([qkv])] + list(zip(ROLES[1:], rest))
    groups.append(("output layer", weights[-1]))
    calls = native.kernel().calls("int8" if arithmetic == "int8" else "float32")
    return loaded, verifier, groups, calls


def time_groups(groups: list, calls, in_width: dict, rounds: int, rng) -> dict:
    """N -> [ms of each group alone] (medians over rounds, the first dropped)."""
    from specdraft.backend.numba_layers import NO_RESIDUAL, project

    out = {}
    for n in TOKENS:
        xs = {w: rng.standard_normal((n, w)).astype(np.float32) for w in set(in_width.values())}
        ys = [np.empty((n, g[2].shape[0]), np.float32) for _, g in groups]
        times = [[] for _ in groups]
        for _ in range(rounds + 1):
            for i, (_, g) in enumerate(groups):
                start = time.perf_counter()
                project(g, xs[in_width[i]], ys[i], NO_RESIDUAL, calls)
                times[i].append(time.perf_counter() - start)
        out[n] = [1e3 * statistics.median(t[1:]) for t in times]
    return out


def input_widths(loaded, groups: list) -> dict:
    """Each group's input width: the MLP's for the down projections, the attention's for its output, else the hidden size."""
    from specdraft.backend.family import family_of

    config = loaded.model.config
    heads, _, head_dim = family_of(config).shape
    widths = {"down": config.intermediate_size, "attention output": heads * head_dim}
    return {i: widths.get(role, config.hidden_size) for i, (role, _) in enumerate(groups)}


def summarise(groups: list, times: dict) -> list[dict]:
    from specdraft.backend.native import NAMES

    rows: dict = {}
    for i, (role, g) in enumerate(groups):
        key = (role, NAMES.get(g[3], str(g[3])))
        row = rows.setdefault(key, {"role": role, "read_as": key[1], "groups": 0, "bytes": 0,
                                    **{f"ms_n{n}": 0.0 for n in TOKENS}})
        row["groups"] += 1
        row["bytes"] += g[0].nbytes
        for n in TOKENS:
            row[f"ms_n{n}"] += times[n][i]
    for row in rows.values():
        row["gb_per_s_n1"] = row["bytes"] / (row["ms_n1"] / 1e3) / 1e9
    return sorted(rows.values(), key=lambda r: -r["ms_n1"])


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--model", default=None, help="a model `load_model` takes (default: the embedded one)")
    parser.add_argument("--arithmetic", default="int8", choices=["int8", "float32"])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    loaded, verifier, groups, calls = build(args.model, args.arithmetic)
    times = time_groups(groups, calls, input_widths(loaded, groups), args.rounds, rng)
    from specdraft.params import SamplingParams

    verifier.admit("row0", rng.integers(0, 1000, size=256).tolist(), SamplingParams())
    steps = {c["k"]: c["step_ms"] for c in verify_step_times(verifier, 1, [n - 1 for n in TOKENS], args.rounds, rng)}
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "load_at_start": load, "model": loaded.name,
              "arithmetic": args.arithmetic, "rounds": args.rounds, "rows": summarise(groups, times),
              "projections_ms": {n: sum(t) for n, t in times.items()}, "step_ms": {n: steps[n - 1] for n in TOKENS}}
    write(result, args.out)


def write(result: dict, out: Path) -> None:
    total = sum(r["bytes"] for r in result["rows"])
    lines = [f"# Where a step reads its weights: {result['model']}, {result['arithmetic']} arithmetic", "",
             f"{result['date']}, {result['machine']}, load {result['load_at_start']:.2f} at the start; medians of "
             f"{result['rounds']} interleaved rounds. `python -m benchmarks.cpu.groups`.", "",
             "| role | read as | groups | MB | ms, 1 token | GB/s, 1 token | ms, 6 tokens | share of the projections' time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    all_ms = result["projections_ms"][1]
    for r in result["rows"]:
        lines.append(f"| {r['role']} | {r['read_as']} | {r['groups']} | {r['bytes'] / 1e6:.0f} | {r['ms_n1']:.2f} | "
                     f"{r['gb_per_s_n1']:.1f} | {r['ms_n6']:.2f} | {r['ms_n1'] / all_ms:.0%} |")
    lines += ["", f"All projections: {total / 1e6:.0f} MB, {all_ms:.1f} ms at 1 token ({total / all_ms / 1e6:.1f} GB/s), "
              f"{result['projections_ms'][6]:.1f} ms at 6. The whole verify step (256 tokens of context): "
              f"{result['step_ms'][1]:.1f} ms at 1 token, {result['step_ms'][6]:.1f} ms at 6."]
    write_results(out, "groups", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
