"""The verify step on a GPU: our step against Hugging Face's forward and the weight-read floor.

For models of the Llama-3.2-1B and -3B shapes (random weights: only the shapes matter here; the
dimensions of `../shared/background/speculative-runner-design-notes.txt`), in one run:
- our verify step (`Verifier.step`, k draft tokens per row) at each batch size and k, for each of
  our kernel choices (`--kernels`, `Verifier`'s `kernels`; by default on CUDA `triton`, our own
  batch-invariant kernels, and `torch`, the torch-module path; on CPU `auto`), with CUDA graphs on
  and off (static shapes either way), medians of interleaved repeats; a choice that fails is
  reported beside the others;
- Hugging Face's own forward of the same k + 1 tokens a row over a `StaticCache`, replayed from a
  CUDA graph (on CPU: run directly), the cache rewound and the forward run in inference mode;
- the floor: the weights' bytes over the device's measured copy bandwidth (a large device-to-device
  copy, bytes read and written);
- the cost ratio c = t(1B step) / t(3B step) at batch 1 and k = 0, and the speed-up it implies for
  the model drafter (1B drafting for 3B) at acceptance rates 0.6 / 0.7 / 0.8, by Leviathan et al.'s
  expected tokens per step (1 - a^(k+1)) / (1 - a) over the step's cost k c + t(k) / t(0), with the
  measured k-step / 1-step ratio t(k) / t(0), for the best k.
Made to be run on a GPU machine (bf16); on CPU `--shapes tiny` runs the same code at tiny shapes in
seconds (what CI runs, so it keeps working).

    python -m benchmarks.gpu.step [--shapes 1b,3b] [--batches 1,4,16,32] [--ks 0,1,3,5,8] [--kernels triton,torch]
                                  [--out benchmarks/results/gpu]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, cli, machine, verify_step_times, write_results

# name -> LlamaConfig fields (Llama-3.2-1B / -3B: tied embeddings, rope theta 500000, vocab 128256)
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, head_dim=128, vocab_size=128256),
    # Qwen2.5-Coder-0.5B / -1.5B (issue 54's pair): q/k/v biases, rope theta 1e6, vocab 151936; the 1.5B's head untied
    "qwen0.5b": dict(family="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen1.5b": dict(family="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=1024),
    "tiny-small": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, vocab_size=1024),
}
ACCEPTANCE = (0.6, 0.7, 0.8)
KERNELS = {"cuda": "triton,torch", "cpu": "auto"}  # --kernels' default by device: the first one gives c


def build(shape: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A model of this shape (`SHAPES`), random weights (seed 0), in `dtype` on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    fields = dict(SHAPES[shape])
    if fields.pop("family", "llama") == "qwen2":
        config, cls = Qwen2Config(**fields, max_position_embeddings=4096, rope_theta=1000000.0), Qwen2ForCausalLM
    else:
        config = LlamaConfig(**fields, max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=True)
        cls = LlamaForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config).to(dtype).eval()
    model.requires_grad_(False)
    return model


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every weight once, less an untied input embedding (one row of it is read)."""
    embedding = model.get_input_embeddings().weight
    tensors = {t.data_ptr(): t for t in list(model.parameters()) + list(model.buffers()) if t is not embedding}
    tensors[model.get_output_embeddings().weight.data_ptr()] = model.get_output_embeddings().weight
    return sum(t.numel() * t.element_size() for t in tensors.values() if t.is_floating_point() or t.dtype == torch.int8)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes a second a device-to-device copy moves (each byte read once and written once)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / statistics.median(times)


def ours(model, device, batches: list[int], ks: list[int], graphs: bool, kernels: str, context: int, repeats: int,
         rng) -> dict:
    """(batch, k) -> ms of our verify step with `kernels` (`Verifier`'s choice of kernels; static
    shapes; CUDA graphs where `graphs` and on CUDA)."""
    from specdraft.backend.rowmodel import StaticShapes
    from specdraft.params import SamplingParams
    from specdraft.verifier import Verifier

    static = StaticShapes(max_rows=max(batches), max_context=context + max(ks) + 16, graphs=graphs)
    verifier = Verifier(model, static=static if device.type == "cuda" or not graphs else None, kernels=kernels)
    for b in range(max(batches)):
        verifier.admit(f"row{b}", rng.integers(0, model.config.vocab_size, size=context).tolist(), SamplingParams())
    out = {}
    for batch in sorted(batches, reverse=True):  # every admitted row takes part: drop rows as batches shrink
        while len(verifier.row_ids) > batch:
            verifier.remove(verifier.row_ids[-1])
        for cell in verify_step_times(verifier, batch, ks, repeats, rng):
            out[(batch, cell["k"])] = cell["step_ms"]
    return out


def profile(model, device, kernels: str, ks: list[int], context: int, rng, steps: int = 10) -> dict:
    """Where a batch-1 step's GPU time goes (CUDA only): for each k, the step's wall time, the GPU
    time its kernels took, and the ten costliest kernels (ms a step), from torch's profiler over
    `steps` steps replayed from their graphs."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler
    from specdraft.backend.rowmodel import StaticShapes
    from specdraft.params import SamplingParams
    from specdraft.verifier import Verifier

    verifier = Verifier(model, static=StaticShapes(max_rows=1, max_context=context + max(ks) + 16), kernels=kernels)
    verifier.admit("row", rng.integers(0, model.config.vocab_size, size=context).tolist(), SamplingParams())
    out = {}
    for k in ks:
        verify_step_times(verifier, 1, [k], 3, rng)  # warm up and capture the shape first
        with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall = verify_step_times(verifier, 1, [k], steps, rng)[0]["step_ms"]
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
        timed = sorted(((e.key, getattr(e, "self_device_time_total", 0) / 1000 / (steps + 1), e.count / (steps + 1))
                        for e in events), key=lambda t: -t[1])
        timed = [t for t in timed if t[1] > 0]
        out[k] = {"wall_ms": wall, "gpu_ms": sum(t[1] for t in timed),
                  "kernels_per_step": sum(t[2] for t in timed),
                  "top": [{"kernel": name[:90], "ms": ms, "calls": calls} for name, ms, calls in timed[:10]]}
        print(f"profile k={k}: wall {wall:.2f} ms, GPU {out[k]['gpu_ms']:.2f} ms, "
              f"{out[k]['kernels_per_step']:.0f} kernels a step", flush=True)
    return out


def hf_static(model, device, batch: int, k: int, context: int, repeats: int, rng) -> float:
    """ms of Hugging Face's forward of k + 1 tokens a row over a StaticCache (replayed from a CUDA graph
    on CUDA), after a prefill of `context` tokens."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_batch_size=batch, max_cache_len=context + k + 1, device=device,
                        dtype=next(model.parameters()).dtype)
    prompt = torch.as_tensor(rng.integers(0, model.config.vocab_size, size=(batch, context)), device=device)
    with torch.inference_mode():
        model(prompt, past_key_values=cache, cache_position=torch.arange(context, device=device), use_cache=True)
    ids = torch.as_tensor(rng.integers(0, model.config.vocab_size, size=(batch, k + 1)), device=device)
    positions = torch.arange(context, context + k + 1, device=device)

    def forward():  # the same k + 1 positions every time: the cache rewound to the prompt first
        # Both inside inference mode: the cache's tensors were made there, and CUDA refuses to update
        # an inference tensor outside it.
        with torch.inference_mode():
            for layer in getattr(cache, "layers", []):  # transformers 5.2x: the write position lives on the device
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    layer.cumulative_length.fill_(context)
            return model(ids, past_key_values=cache, cache_position=positions, position_ids=positions[None].expand(batch, -1),
                         use_cache=True).logits

    run = forward
    if device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        run = graph.replay
    run()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def implied_speedup(c: float, ratios: dict[int, float], acceptance: float) -> tuple[float, int]:
    """(best speed-up, its k): Leviathan et al.'s expected tokens per step over the step's cost in
    target steps, k draft steps of cost c plus a verify of measured cost ratios[k] = t(k) / t(0)."""
    best = (0.0, 0)
    for k, ratio in ratios.items():
        if k == 0:
            continue
        tokens = (1 - acceptance ** (k + 1)) / (1 - acceptance)
        best = max(best, (tokens / (k * c + ratio), k))
    return best


def arguments() -> tuple[argparse.Namespace, list[str]]:
    """The command line, and its shapes checked: two of `SHAPES`, draft then target."""
    parser = cli(__doc__, RESULTS / "gpu")
    parser.add_argument("--shapes", default="1b,3b", help=f"two of {', '.join(SHAPES)}: draft, then target")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--ks", default="0,1,3,5,8")
    parser.add_argument("--context", type=int, default=256, help="tokens of context each row has")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--kernels", default=None, help="our kernel choices to time, the first giving c (`Verifier`'s "
                        f"`kernels`; default: {', '.join(f'{d}: {k}' for d, k in KERNELS.items())})")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the target's batch-1 steps (CUDA): GPU time and the costliest kernels")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",")]
    if len(shapes) != 2 or any(s not in SHAPES for s in shapes):
        parser.error(f"--shapes takes two of {', '.join(SHAPES)} (draft, target), got {args.shapes!r}")
    return args, shapes


def time_ours(model, device, shape: str, batches: list[int], ks: list[int], kernels: list[str], context: int,
              repeats: int, rng) -> tuple[dict, dict[str, str]]:
    """Our step with every kernel choice, CUDA graphs on (CUDA only) and off: the cells ("batch,k" ->
    {"batch", "k", `column`: ms}), and the errors of the choices that failed."""
    cells, errors = {}, {}
    for kernel in kernels:
        for graphs in (True, False):
            if graphs and device.type != "cuda":
                continue
            try:  # one run on a lent GPU: a kernel choice that fails is reported, the others measured
                times = ours(model, device, batches, ks, graphs, kernel, context, repeats, rng)
            except Exception as exc:
                errors[f"{shape} {column(kernel, graphs)}"] = f"{type(exc).__name__}: {exc}"
                print(f"{shape} {column(kernel, graphs)}: {type(exc).__name__}: {exc}", flush=True)
                continue
            for (batch, k), ms in times.items():
                cells.setdefault(f"{batch},{k}", {"batch": batch, "k": k})[column(kernel, graphs)] = ms
    return cells, errors


def time_hf(model, device, shape: str, batch_ks: list[tuple[int, int]], context: int, repeats: int,
            rng) -> tuple[dict[tuple[int, int], float | None], dict[str, str]]:
    """Hugging Face's static-cache forward at each (batch, k): its ms (None where it failed), and the errors."""
    times, errors = {}, {}
    for batch, k in batch_ks:
        try:
            times[(batch, k)] = hf_static(model, device, batch, k, context, repeats, rng)
        except Exception as exc:
            times[(batch, k)] = None
            errors[f"{shape} hf_static b{batch} k{k}"] = f"{type(exc).__name__}: {exc}"
    return times, errors


def profiles(model, device, shape: str, kernels: list[str], ks: list[int], context: int,
             rng) -> tuple[dict, dict[str, str]]:
    """`profile` at k = 0 and the largest k for each kernel choice: kernel -> its profile, and the errors."""
    out, errors = {}, {}
    for kernel in kernels:
        try:
            out[kernel] = profile(model, device, kernel, sorted({0, max(ks)}), context, rng)
        except Exception as exc:
            errors[f"{shape} profile {kernel}"] = f"{type(exc).__name__}: {exc}"
    return out, errors


def measure(shape: str, device, dtype, batches: list[int], ks: list[int], kernels: list[str], context: int,
            repeats: int, bandwidth: float, profiling: bool, rng) -> tuple[dict, dict[str, str]]:
    """One model's figures (its config, weight bytes, floor, cells and, where `profiling`, profiles),
    and the errors of whatever failed."""
    model = build(shape, device, dtype)
    cells, errors = time_ours(model, device, shape, batches, ks, kernels, context, repeats, rng)
    for batch, k in ((b, k) for b in batches for k in ks):  # HF's forward for every cell, ours measured or not
        cells.setdefault(f"{batch},{k}", {"batch": batch, "k": k})
    hf, hf_errors = time_hf(model, device, shape, [(c["batch"], c["k"]) for c in cells.values()], context, repeats, rng)
    for cell in cells.values():
        cell["hf_static_ms"] = hf[(cell["batch"], cell["k"])]
    errors.update(hf_errors)
    nbytes = weight_bytes(model)
    figures = {"config": SHAPES[shape], "weight_bytes": nbytes, "floor_ms": 1000 * nbytes / bandwidth,
               "cells": sorted(cells.values(), key=lambda c: (c["batch"], c["k"]))}
    if profiling and device.type == "cuda":
        profiled, profile_errors = profiles(model, device, shape, kernels, ks, context, rng)
        if profiled:
            figures["profile"] = profiled
        errors.update(profile_errors)
    return figures, errors


def cost_ratio(draft: dict, target: dict, key: str, ks: list[int]) -> dict:
    """c = t(draft step) / t(target step) at batch 1, k = 0, and the speed-up it implies at each of
    `ACCEPTANCE`, from the cells' `key` column; empty unless both models have every batch-1 cell."""
    def at(model, batch, k):
        return next((c.get(key) for c in model["cells"] if c["batch"] == batch and c["k"] == k), None)

    if not all(at(model, 1, k) is not None for model in (draft, target) for k in ks):
        return {}
    c = at(draft, 1, 0) / at(target, 1, 0)
    ratios = {k: at(target, 1, k) / at(target, 1, 0) for k in ks}
    return {"cost_ratio_c": c, "implied_speedup": [{"acceptance": a, "speedup": s, "k": k}
                                                   for a in ACCEPTANCE for s, k in [implied_speedup(c, ratios, a)]]}


def main() -> None:
    args, shapes = arguments()
    batches = [int(b) for b in args.batches.split(",")]
    ks = sorted({0, *(int(k) for k in args.ks.split(","))})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kernels = [k.strip() for k in (args.kernels or KERNELS[device.type]).split(",") if k.strip()]
    dtype = getattr(torch, args.dtype)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    bandwidth = copy_bandwidth(device, nbytes=(1 << 30) if device.type == "cuda" else (256 << 20))
    result = {"date": dt.date.today().isoformat(), "machine": machine(), "device": str(device), "dtype": args.dtype,
              "load_before": load_before, "context": args.context, "repeats": args.repeats,
              "copy_bandwidth_gb_s": bandwidth / 1e9, "kernels": kernels, "errors": {}, "models": {}}
    key = column(kernels[0], device.type == "cuda")
    for shape in shapes:
        figures, errors = measure(shape, device, dtype, batches, ks, kernels, args.context, args.repeats, bandwidth,
                                  args.profile, rng)
        result["models"][shape] = figures
        result["errors"].update(errors)
        print(f"{shape} ({kernels[0]}): " + ", ".join(f"b{c['batch']} k{c['k']} {c[key]:.2f} ms"
                                                      for c in figures["cells"] if key in c), flush=True)
        write(result, args.out, shapes)  # each model's figures as soon as they are measured: a run stopped later keeps them
    result.update(cost_ratio(*(result["models"][s] for s in shapes), key, ks))
    write(result, args.out, shapes)


def column(kernels: str, graphs: bool) -> str:
    """A cell's key for our step's ms with `kernels`, CUDA graphs on or off."""
    return f"ours_{kernels}_graphs_{'on' if graphs else 'off'}_ms"


def write(result: dict, out: Path, shapes: list[str]) -> None:
    lines = [
        f"# Verify step on {result['device']}: ours against Hugging Face's static-cache forward and the floor",
        "",
        f"{result['date']}, {result['machine']}; {result['dtype']}, random weights of the {' and '.join(shapes)} shapes, "
        f"{result['context']} tokens of context a row, medians of {result['repeats']} repeats; copy bandwidth "
        f"{result['copy_bandwidth_gb_s']:.0f} GB/s. Run with `python -m benchmarks.gpu.step`.",
        "",
    ]
    for shape, model in result["models"].items():
        columns = [(kernels, graphs) for kernels in result["kernels"] for graphs in (True, False)]
        lines += [f"## {shape}: {model['weight_bytes'] / 1e9:.2f} GB of weights, floor {model['floor_ms']:.2f} ms", "",
                  "| batch | k | " + " | ".join(f"ours {k}, graphs {'on' if g else 'off'}" for k, g in columns)
                  + " | HF static cache | best ours / floor |",
                  "| --- | --- | " + "--- | " * len(columns) + "--- | --- |"]
        for cell in model["cells"]:
            times = [cell.get(column(k, g)) for k, g in columns]
            best = min((t for t in times if t is not None), default=None)
            lines.append(f"| {cell['batch']} | {cell['k']} | "
                         + " | ".join("—" if t is None else f"{t:.2f}" for t in times)
                         + (" | —" if cell["hf_static_ms"] is None else f" | {cell['hf_static_ms']:.2f}") + " | "
                         + ("—" if best is None else f"{best / model['floor_ms']:.1f}x") + " |")
        lines.append("")
        for kernels, by_k in model.get("profile", {}).items():
            for k, prof in by_k.items():
                lines += [f"Profile, `{kernels}`, batch 1, k = {k}: wall {prof['wall_ms']:.2f} ms a step, GPU "
                          f"{prof['gpu_ms']:.2f} ms in {prof['kernels_per_step']:.0f} kernels; costliest:", "",
                          "| kernel | ms a step | calls a step |", "| --- | --- | --- |"]
                lines += [f"| `{t['kernel']}` | {t['ms']:.3f} | {t['calls']:.0f} |" for t in prof["top"]] + [""]
    lines += [f"- {where}: {error}" for where, error in result["errors"].items()] + ([""] if result["errors"] else [])
    if "cost_ratio_c" in result:
        lines += [f"Cost ratio c = t({shapes[0]} step) / t({shapes[1]} step), batch 1, k = 0, ours with "
                  f"`{result['kernels'][0]}`: **{result['cost_ratio_c']:.3f}**. "
                  "Implied speed-up of the model drafter (Leviathan et al., the measured k-step cost): " + "; ".join(
                      f"acceptance {r['acceptance']}: {r['speedup']:.2f}x at k = {r['k']}" for r in result["implied_speedup"])]
    else:
        lines.append(f"Cost ratio c: not measured (both models at batch 1, k = 0, with `{result['kernels'][0]}` are needed).")
    write_results(out, f"gpu_step_{result['device'].split(':')[0]}", result, "\n".join(lines))


if __name__ == "__main__":
    main()
