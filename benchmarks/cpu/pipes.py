"""The 256-bit pipes' limit on the int8 arithmetic's products without VNNI (the `avx2` kernel path, what
a Zen 3 runs), measured on this machine: one core's clock (a chain of dependent adds, one a cycle) and
its throughput of the instructions a product of 4 weights of 8 rows and a token's 4 activations is made
of (`vpmaddubsw`, its sum's `vpaddw`, the token's group broadcast from memory), each in a loop of
independent chains, compiled and run here. With `--model`, the floor of a pass of `--tokens` tokens
over the GGUF's matrices: one `vpmaddubsw` (32 products) and one `vpaddw` per 32 weights and token, at
the measured rate on every core; the kernel's other work (unpacking the weights, scales, float sums)
comes on top.

    python -m benchmarks.cpu.pipes [--model qwen2.5-coder-1.5b-instruct] [--tokens 6] [--cores 2]
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, cli, machine, write_results
from specdraft.backend.native.build import cxx

LINES = {  # what each line measures, per nanosecond of one core; the loop body's 4 independent chains
    "clock": ("dependent adds (one a cycle): the clock, GHz", "add $1, %%rax\\n"),
    "vpmaddubsw": ("vpmaddubsw alone", "vpmaddubsw %%ymm0, %%ymm1, %%ymm{d}\\n"),
    "vpaddw": ("vpaddw alone", "vpaddw %%ymm0, %%ymm1, %%ymm{d}\\n"),
    "vpmaddwd": ("vpmaddwd alone", "vpmaddwd %%ymm0, %%ymm1, %%ymm{d}\\n"),
    "product": ("vpmaddubsw + its vpaddw (a product of 32 weights and int8s, summed in int16)",
                "vpmaddubsw %%ymm0, %%ymm1, %%ymm{d}\\n vpaddw %%ymm{d}, %%ymm{acc}, %%ymm{acc}\\n"),
    "broadcast_product": ("the same after the token's group broadcast from memory (the kernel's inner loop)",
                          "vpbroadcastd {off}(%0), %%ymm{d}\\n vpmaddubsw %%ymm{d}, %%ymm1, %%ymm{d}\\n"
                          " vpaddw %%ymm{d}, %%ymm{acc}, %%ymm{acc}\\n"),
}
CLOBBERS = '"rax", ' + ", ".join(f'"xmm{i}"' for i in range(2, 10))


def source() -> str:
    """The C program: per line, 10^8 iterations of 8 x its 4 chains, and the line's count per ns."""
    loops = []
    for name, (_, chain) in LINES.items():
        body = "".join(chain.format(d=2 + i, acc=6 + i, off=4 * i) for i in range(4))
        loops.append(f"""    t = now();
    for (long i = 0; i < n; i++) asm volatile(R8("{body}") :: "r"(group) : {CLOBBERS});
    printf("{name} %.4f\\n", 32.0 * n / (now() - t) * 1e-9);""")
    return """#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec a; clock_gettime(CLOCK_MONOTONIC, &a); return a.tv_sec + a.tv_nsec * 1e-9; }
#define R8(X) X X X X X X X X
static int32_t group[64] __attribute__((aligned(64)));
int main(void) {
    const long n = 100000000;
    double t;
""" + "\n".join(loops) + "\n    return 0;\n}\n"


def rates() -> dict[str, float]:
    """Each line's figure (per ns of one core; `clock` in GHz), compiled and run here."""
    compiler = cxx()
    if compiler is None:
        raise SystemExit("pipes: no C++ compiler found (set CXX, or install g++)")
    with tempfile.TemporaryDirectory() as tmp:
        program, binary = Path(tmp) / "pipes.c", Path(tmp) / "pipes"
        program.write_text(source())
        subprocess.run([compiler, "-x", "c", "-O2", "-mavx2", str(program), "-o", str(binary)], check=True)
        out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def model_weights(model: str) -> dict[str, int]:
    """Weights a pass multiplies per token, by GGUF kind: every 2-D tensor but the input embedding,
    which counts where it is also the output layer (no `output.weight`)."""
    from gguf import GGUFReader

    from specdraft.models import resolve

    _, path = resolve(model)
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    out: dict[str, int] = {}
    for name, t in tensors.items():
        if len(t.shape) == 2 and (name != "token_embd.weight" or "output.weight" not in tensors):
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.n_elements)
    return out


def main() -> None:
    parser = cli(__doc__, RESULTS / "avx2" / "pipes")
    parser.add_argument("--model", default=None, help="a GGUF (a name `specdraft models` lists, or a path) to price a pass of")
    parser.add_argument("--tokens", type=int, default=6, help="the pass's tokens (default 6: a verify pass of k = 5)")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the pass runs on (default: all)")
    args = parser.parse_args()
    measured = rates()
    clock = measured["clock"]
    where = machine()
    result = {"machine": where, "per_ns": measured,
              "per_cycle": {k: v / clock for k, v in measured.items() if k != "clock"}, "cores": args.cores}
    lines = [f"# The 256-bit pipes' limit on the int8 products ({where})", "",
             "`python -m benchmarks.cpu.pipes`: one core, loops of 32 independent instructions compiled with "
             "`-mavx2` (no VNNI, no AVX-512).", "", "| instruction(s) | per ns, one core | per cycle |", "| --- | --- | --- |"]
    lines += [f"| {LINES[k][0]} | {v:.2f} | {'—' if k == 'clock' else f'{v / clock:.2f}'} |" for k, v in measured.items()]
    if args.model:
        weights = model_weights(args.model)
        products = sum(weights.values()) * args.tokens / 32
        floor_ms = products / (measured["broadcast_product"] * 1e9 * args.cores) * 1e3
        result.update(model=args.model, weights_by_kind=weights, tokens=args.tokens, floor_ms=floor_ms)
        lines += ["", f"{args.model}: {sum(weights.values()) / 1e9:.3f} G weights a token "
                  f"({', '.join(f'{k} {v / 1e6:.0f} M' for k, v in sorted(weights.items()))}); a pass of {args.tokens} "
                  f"tokens: {products / 1e6:.0f} M `vpmaddubsw` (and as many `vpaddw`), **{floor_ms:.1f} ms** at the "
                  f"measured rate on {args.cores} cores, before any unpacking or float work."]
    write_results(args.out, "pipes", result, "\n".join(lines))


if __name__ == "__main__":
    main()
