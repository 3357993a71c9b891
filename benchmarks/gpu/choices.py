"""How the Triton kernels should launch on this GPU (`triton_kernels.Choice`), measured inside a whole
verify step, and where a step stands against its floor (issue 55).

For each shape (random weights, bf16), each choice gets its own `Verifier` (static shapes, CUDA
graphs; the choice is fixed when its layers are built), and the choices are timed in interleaved
rounds, medians over rounds:
- `step_ms`: `Verifier.step` of k draft tokens a row, host work included (`benchmarks.common`);
- `replay_ms`: the captured graph of that pass replayed alone (CUDA events, many replays): the GPU's
  time for the forward, launch gaps inside the graph included; `host_ms` = step - replay;
- the floor: the bytes a step reads over the card's measured copy bandwidth; Hugging Face's
  static-cache forward in a CUDA graph at the same (batch, k) beside it (`step.hf_static`).
Every choice is timed on the first shape, the first choice (the default) and the fastest on the others.
The choice with the lowest median batch-1 k = 0 step on the first shape is written to `--choose`
(a line for `SPECDRAFT_TRITON_CHOICE`), so that one GPU call can pick a choice and then test it.
`--draft-pairs` adds the cost ratio c of each draft/target pair (`1b-int8`: the 1B's own int8 copy,
the self-draft on these kernels) and the speed-up it implies (`step.implied_speedup`).

    python -m benchmarks.gpu.choices [--shapes 1b,3b,qwen0.5b,qwen1.5b] [--choices NAME=FIELDS;...]
                                     [--rounds 5] [--choose FILE]
On CPU, under `TRITON_INTERPRET=1`, `--shapes tiny-small` runs the same code in a minute or two (graphs off, no replays).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import statistics
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results
from benchmarks.gpu.step import SHAPES, build, copy_bandwidth, hf_static, implied_speedup, weight_bytes
from specdraft.backend import triton_kernels as tk

# The first is the default (`triton_kernels.Choice()`); "before" what the kernels launched with until issue 55.
CHOICES = "default=;before=pdl=0,stages=3,target=128;no-pdl=pdl=0;programs-256=target=256"
CELLS = ((1, 0), (1, 5), (16, 5))  # (batch, k) timed for every choice
ACCEPTANCE = (0.6, 0.7, 0.8)


@contextlib.contextmanager
def chosen(choice: tk.Choice):
    """Layers built inside take `choice` (`TritonLayers` reads `triton_kernels.CHOICE` once)."""
    before, tk.CHOICE = tk.CHOICE, choice
    try:
        yield
    finally:
        tk.CHOICE = before


def parse_choices(text: str) -> dict[str, tk.Choice]:
    out = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, _, fields = item.partition("=")
        out[name.strip()] = tk.Choice.parse(fields)
    return out


def int8_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The self-draft: the model with every linear (the head too) an int8 `WeightOnlyInt8Linear`."""
    from specdraft.backend.weight_only_int8 import use_weight_only_int8

    draft = copy.deepcopy(model)
    use_weight_only_int8(draft)
    return draft


def verifier_for(model, choice: tk.Choice, device, batch: int, context: int, rng):
    """A verifier of `batch` rows of `context` random tokens whose layers take `choice` (every row
    takes part in every step, so each batch size gets its own)."""
    from specdraft.backend.rowmodel import StaticShapes
    from specdraft.params import SamplingParams
    from specdraft.verifier import Verifier

    static = StaticShapes(max_rows=batch, max_context=context + max(k for _, k in CELLS) + 16,
                          graphs=device.type == "cuda")
    with chosen(choice):
        verifier = Verifier(model, static=static, kernels="triton")
    for b in range(batch):
        verifier.admit(f"row{b}", rng.integers(0, model.config.vocab_size, size=context).tolist(), SamplingParams())
    return verifier


def replay_ms(verifier, k: int, replays: int = 50) -> float | None:
    """ms of one replay of the captured graph of the verifier's (k + 1)-token pass over all its rows,
    alone (None: not captured)."""
    graphs = [s.graph for key, s in verifier.rows._shapes.items() if key[1] == k + 1 and s.graph is not None]
    if not graphs:
        return None
    graph = graphs[0]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def time_cells(verifiers: dict, rng, repeats: int) -> dict:
    """(batch, k) -> {"step_ms", "replay_ms"} for `CELLS`, each batch on its own verifier."""
    out = {}
    for batch, verifier in verifiers.items():
        ks = [k for b, k in CELLS if b == batch]
        for cell in verify_step_times(verifier, batch, ks, repeats, rng):
            replay = replay_ms(verifier, cell["k"]) if verifier.device.type == "cuda" else None
            out[(batch, cell["k"])] = {"step_ms": cell["step_ms"], "replay_ms": replay}
    return out


def measure_shape(model, choices: dict[str, tk.Choice], device, args, rng) -> dict:
    """Every choice on one model: name -> "batch,k" -> medians over `args.rounds` interleaved rounds
    (a choice that fails is kept with its error), and, with `args.profile`, where the batch-1 k = 0
    step's GPU time goes for each choice."""
    verifiers, errors, profiles = {}, {}, {}
    for name, choice in choices.items():
        try:
            verifiers[name] = {b: verifier_for(model, choice, device, b, args.context, rng)
                               for b in sorted({b for b, _ in CELLS if b in args.batches})}
            time_cells(verifiers[name], rng, 3)  # warm up: compile, capture
        except Exception as exc:  # one lent call: a choice that fails is reported, the others measured
            errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"choice {name}: {errors[name]}", flush=True)
            verifiers.pop(name, None)
    samples: dict = {name: {} for name in verifiers}
    for _ in range(args.rounds):
        for name, by_batch in verifiers.items():
            for cell, times in time_cells(by_batch, rng, args.repeats).items():
                for key, value in times.items():
                    samples[name].setdefault(f"{cell[0]},{cell[1]}", {}).setdefault(key, []).append(value)
    out = {name: {cell: {key: (statistics.median(v) if None not in v else None) for key, v in by_key.items()}
                  for cell, by_key in cells.items()} for name, cells in samples.items()}
    if args.profile and device.type == "cuda" and 1 in args.batches:
        for name, by_batch in verifiers.items():
            try:
                profiles[name] = profile_step(by_batch[1])
            except Exception as exc:  # reported, not fatal
                errors[f"{name} profile"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return {"choices": out, "errors": errors, "profiles": profiles}


def profile_step(verifier, steps: int = 10) -> dict:
    """A batch-1 k = 0 step under torch's profiler: its wall ms, the GPU ms of its kernels, how many
    kernels, and the costliest five (ms a step)."""
    from torch.profiler import ProfilerActivity, profile

    verify_step_times(verifier, 1, [0], 2, np.random.default_rng(1))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = verify_step_times(verifier, 1, [0], steps, np.random.default_rng(2))[0]["step_ms"]
    timed = sorted(((e.key, getattr(e, "self_device_time_total", 0) / 1000 / (steps + 1), e.count / (steps + 1))
                    for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0), key=lambda t: -t[1])
    return {"wall_ms": wall, "gpu_ms": sum(t[1] for t in timed), "kernels": sum(t[2] for t in timed),
            "top": [{"kernel": name[:80], "ms": ms, "calls": calls} for name, ms, calls in timed[:5]]}


def best_choice(figures: dict) -> str | None:
    """The choice with the lowest batch-1 k = 0 step of a model's figures."""
    timed = {name: cells["1,0"]["step_ms"] for name, cells in figures["choices"].items() if "1,0" in cells}
    return min(timed, key=timed.get) if timed else None


def hf_cells(model, device, args, rng) -> dict:
    out = {}
    for batch, k in CELLS:
        if batch in args.batches:
            try:
                out[f"{batch},{k}"] = hf_static(model, device, batch, k, args.context, args.repeats, rng)
            except Exception as exc:  # reported, not fatal
                out[f"{batch},{k}"] = None
                print(f"hf_static b{batch} k{k}: {type(exc).__name__}: {exc}", flush=True)
    return out


def pair_speedups(models: dict, pairs: list[tuple[str, str]], choice: str) -> list[dict]:
    """c = t(draft b1 k0) / t(target b1 k0) with `choice`, and the implied speed-ups at `ACCEPTANCE`
    (the target's measured k = 5 / k = 0 step ratio)."""
    out = []
    for draft, target in pairs:
        try:
            d, t = (models[name]["choices"][choice] for name in (draft, target))
            c = d["1,0"]["step_ms"] / t["1,0"]["step_ms"]
            ratios = {0: 1.0, 5: t["1,5"]["step_ms"] / t["1,0"]["step_ms"]}
        except KeyError:
            continue
        for k in range(1, 5):  # between 0 and 5, the verify's cost taken as linear in k
            ratios[k] = 1 + (ratios[5] - 1) * k / 5
        out.append({"draft": draft, "target": target, "c": c, "implied": [
            {"acceptance": a, "speedup": s, "k": k} for a in ACCEPTANCE for s, k in [implied_speedup(c, ratios, a)]]})
    return out


def model_for(shape: str, device, dtype) -> torch.nn.Module:
    """A model of `SHAPES`, or "<shape>-int8": that model's int8 copy (the self-draft)."""
    base, _, int8 = shape.partition("-int8")
    model = build(base, device, dtype)
    return int8_copy(model) if shape.endswith("-int8") else model


def arguments() -> argparse.Namespace:
    parser = cli(__doc__, RESULTS / "gpu")
    parser.add_argument("--shapes", default="1b,1b-int8,qwen1.5b,qwen0.5b,3b",
                        help=f"of {', '.join(SHAPES)}, or <shape>-int8 (its int8 copy); the first picks the choice")
    parser.add_argument("--choices", default=CHOICES, help="NAME=FIELDS;... (fields as SPECDRAFT_TRITON_CHOICE)")
    parser.add_argument("--batches", default="1,16", help="batch sizes of `CELLS` to time")
    parser.add_argument("--pairs", default="1b-int8:1b,qwen0.5b:qwen1.5b,1b:3b", help="draft:target pairs for c")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="steps a cell a round (their median)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--hf", default="1b", help="shapes to time Hugging Face's static-cache forward on")
    parser.add_argument("--choose", type=Path, default=None, help="write the fastest choice's fields here")
    parser.add_argument("--profile", action="store_true", help="profile each choice's batch-1 step (CUDA)")
    args = parser.parse_args()
    args.shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    for shape in args.shapes:
        if shape.partition("-int8")[0] not in SHAPES:
            parser.error(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}, or <shape>-int8")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if ":" in p]
    return args


def main() -> None:
    args = arguments()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    choices = parse_choices(args.choices)
    rng = np.random.default_rng(0)
    bandwidth = copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (64 << 20))
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "pdl_available": tk.pdl_available(device), "copy_bandwidth_gb_s": bandwidth / 1e9,
              "context": args.context, "rounds": args.rounds, "repeats": args.repeats,
              "choices": {name: c.describe() for name, c in choices.items()}, "models": {}}
    for i, shape in enumerate(args.shapes):
        model = model_for(shape, device, torch.bfloat16)
        # The first shape tries every choice; the others the first choice (the default) and the fastest.
        tried = choices if i == 0 else {n: c for n, c in choices.items() if n in (next(iter(choices)), result["best"])}
        figures = measure_shape(model, tried, device, args, rng)
        figures.update(weight_bytes=weight_bytes(model), floor_ms=1000 * weight_bytes(model) / bandwidth)
        if shape in args.hf.split(","):
            figures["hf_static_ms"] = hf_cells(model, device, args, rng)
        result["models"][shape] = figures
        if i == 0:
            result["best"] = best_choice(figures) or next(iter(choices))
            if args.choose:
                args.choose.parent.mkdir(parents=True, exist_ok=True)
                args.choose.write_text(choices[result["best"]].describe() + "\n")
        print(summary(shape, figures), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        write(result, args.out)
    result["pairs"] = pair_speedups(result["models"], args.pairs, result["best"])
    write(result, args.out)


def summary(shape: str, figures: dict) -> str:
    cells = "; ".join(f"{name}: " + ", ".join(f"b{c.replace(',', ' k')} {v['step_ms']:.2f}" for c, v in cs.items())
                      for name, cs in figures["choices"].items())
    return f"{shape} (floor {figures['floor_ms']:.2f} ms): {cells}"


def fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def write(result: dict, out: Path) -> None:
    lines = [f"# Kernel launch choices inside a verify step, {result['device_name']}", "",
             f"{result['date']}, {result['machine']}; bf16, random weights, {result['context']} tokens of context a "
             f"row; medians of {result['rounds']} interleaved rounds of {result['repeats']} steps; copy bandwidth "
             f"{result['copy_bandwidth_gb_s']:.0f} GB/s; programmatic dependent launch available: "
             f"{result['pdl_available']}. Run with `python -m benchmarks.gpu.choices`.", "",
             "Choices: " + "; ".join(f"`{n}` ({f})" for n, f in result["choices"].items()) + "."
             + (f" Fastest at batch 1, k = 0 on the first shape: **`{result['best']}`**." if "best" in result else ""), ""]
    for shape, m in result["models"].items():
        lines += [f"## {shape}: {m['weight_bytes'] / 1e9:.3f} GB read a step, floor {m['floor_ms']:.3f} ms", "",
                  "| choice | batch, k | step ms | graph replay ms | host ms | step / floor | HF static + graph ms |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, cells in m["choices"].items():
            for cell, v in cells.items():
                host = None if v["replay_ms"] is None else v["step_ms"] - v["replay_ms"]
                hf = m.get("hf_static_ms", {}).get(cell)
                lines.append(f"| `{name}` | {cell} | {fmt(v['step_ms'])} | {fmt(v['replay_ms'])} | {fmt(host)} | "
                             f"{v['step_ms'] / m['floor_ms']:.2f}x | {fmt(hf)} |")
        lines += [f"- `{name}` failed: {error}" for name, error in m["errors"].items()] + [""]
        for name, p in m.get("profiles", {}).items():
            lines += [f"Profile of `{name}`, batch 1, k = 0: wall {p['wall_ms']:.2f} ms, GPU {p['gpu_ms']:.2f} ms in "
                      f"{p['kernels']:.0f} kernels; costliest: " + "; ".join(
                          f"`{t['kernel']}` {t['ms']:.3f} ms ({t['calls']:.0f} calls)" for t in p["top"]), ""]
    for pair in result.get("pairs", []):
        lines.append(f"- {pair['draft']} drafting for {pair['target']}: c = {pair['c']:.3f}; implied speed-up "
                     + ", ".join(f"{r['speedup']:.2f}x at acceptance {r['acceptance']} (k = {r['k']})"
                                 for r in pair["implied"]))
    write_results(out, f"gpu_choices_{result['device'].split(':')[0]}", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
