"""Two versions of the compiled kernel side by side: the C++ of a git revision (`--base`) and the
working tree's, each built for every path (native, ymm, avx2, portable) and loaded into one process.

- **Bitwise:** on every path, each block kind's tiles, and its int8 and float32 projections of the
  same random blocks and tokens (pass widths 1-17 and 33, 40 rows: a last tile of 8), old against new.
- **Time:** on one path (`--path`; default `SPECDRAFT_KERNEL_PATH`, else native), each kind's int8
  projection of a 1.5B-shaped matrix (`kind_kernel`'s) and its float32 one, at 1 and 6 tokens, old
  and new interleaved (their order alternating a round), medians of `--rounds`.

A change meant to leave the kernel's sums alone (a restructuring) is held to both: every array
equal, every time within the noise.

    python -m benchmarks.cpu.kernel_ab [--base HEAD] [--path avx2] [--rounds 9] [--name kernel_ab]
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, cli, machine, write_results
from benchmarks.cpu.kind_kernel import synthetic_blocks
from specdraft.backend import native
from specdraft.backend.native.build import CSRC, PATHS, build, chosen_path
from specdraft.backend.native.library import Kernel
from specdraft.backend.numba_layers import NO_RESIDUAL, project

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = [*range(1, 18), 33]  # pass widths compared bitwise
SHAPES = {"Q4_0": (8960, 1536), "Q4_1": (8960, 1536), "Q5_0": (4864, 896), "Q5_1": (4864, 896), "Q8_0": (8960, 1536),
          "IQ4_NL": (8960, 1536), "Q4_K": (8960, 1536), "Q5_K": (8960, 1536), "IQ4_XS": (8960, 1536), "Q3_K": (8960, 1536), "Q2_K": (8960, 1536),
          "Q6_K": (1536, 8960), "F16": (8960, 1536), "BF16": (8960, 1536)}


def shared_kinds(old: Kernel) -> list[native.BlockKind]:
    """The kinds both versions read: the table's that the old kernel states alike (a kind the change
    adds has nothing to be compared with)."""
    return [kind for kind in native.KINDS.values() if old.kind(kind.number) == (kind.name, kind.weights, kind.bytes)]


def revision_source(revision: str, into: Path) -> Path:
    """The kernel's C++ as `revision` holds it, written under `into`."""
    relative = CSRC.relative_to(ROOT)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, str(relative)], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / relative


def projection(kernel: Kernel, weights: np.ndarray, kind: int, x: np.ndarray, arithmetic: str):
    """A call that computes y = w x (+ a bias) through the kernel into the array it returns, `weights` as
    the arithmetic reads them (tiles for int8)."""
    rows = weights.shape[0]
    layer = (weights, np.zeros(0, np.float32), np.linspace(-1, 1, rows, dtype=np.float32), kind)
    y, calls = np.empty((x.shape[0], rows), np.float32), kernel.calls(arithmetic)

    def call() -> np.ndarray:
        project(layer, x, y, NO_RESIDUAL, calls)
        return y
    return call


def bitwise(old: Kernel, new: Kernel) -> list[str]:
    """Every array the two kernels give apart (empty where all are equal)."""
    rng, differ = np.random.default_rng(1), []
    for kind in shared_kinds(old):
        blocks = synthetic_blocks(rng, kind, 40, 512)
        tiles = {"old": old.tile(blocks, kind.number), "new": new.tile(blocks, kind.number)}
        if tiles["old"].tobytes() != tiles["new"].tobytes():
            differ.append(f"{kind.name} tiles")
        for n in WIDTHS:
            x = rng.standard_normal((n, 512)).astype(np.float32)
            for arithmetic, old_w, new_w in (("int8", tiles["old"], tiles["new"]), ("float32", blocks, blocks)):
                a = projection(old, old_w, kind.number, x, arithmetic)()
                b = projection(new, new_w, kind.number, x, arithmetic)()
                if a.tobytes() != b.tobytes():
                    differ.append(f"{kind.name} {arithmetic} {n} tokens")
    return differ


def call_ms(call, calls: int = 20) -> float:
    """Median ms of one call (5 batches of `calls`, after one untimed)."""
    call()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - started) / calls * 1000)
    return statistics.median(times)


def timed(old: Kernel, new: Kernel, rounds: int) -> list[dict]:
    """Each kind, arithmetic and pass width: old and new interleaved, medians of `rounds`."""
    rng, cells = np.random.default_rng(0), []
    for kind in shared_kinds(old):
        rows, width = SHAPES[kind.name]
        blocks = synthetic_blocks(rng, kind, rows, width)
        weights = {("int8", "old"): old.tile(blocks, kind.number), ("int8", "new"): new.tile(blocks, kind.number),
                   ("float32", "old"): blocks, ("float32", "new"): blocks}
        kernels = {"old": old, "new": new}
        for arithmetic in ("int8", "float32"):
            for n in (1, 6):
                x = rng.standard_normal((n, width)).astype(np.float32)
                calls = {which: projection(kernels[which], weights[arithmetic, which], kind.number, x, arithmetic)
                         for which in kernels}
                ms = {"old": [], "new": []}
                for r in range(rounds):
                    for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                        ms[which].append(call_ms(calls[which]))
                old_ms, new_ms = statistics.median(ms["old"]), statistics.median(ms["new"])
                cells.append({"kind": kind.name, "shape": f"{rows}x{width}", "arithmetic": arithmetic, "tokens": n,
                              "old_ms": old_ms, "new_ms": new_ms, "ratio": new_ms / old_ms, "rounds": ms})
    return cells


def report(base: str, path: str, rounds: int, differ: dict[str, list[str]], cells: list[dict], added: list[str]) -> str:
    lines = [f"# The kernel at {base} against the working tree's", "",
             f"{machine()}; `python -m benchmarks.cpu.kernel_ab --base {base} --path {path} --rounds {rounds}`.", "",
             *([f"Kinds new in the working tree (nothing to compare them with): {', '.join(added)}.", ""] if added else []),
             "## Bitwise, every path", "", "| path | arrays apart |", "| --- | --- |"]
    lines += [f"| {p} | {', '.join(d) if d else 'none: tiles and both arithmetics equal at every width'} |"
              for p, d in differ.items()]
    lines += ["", f"## Time on the {path} path (ms, medians of {rounds} rounds, interleaved)", "",
              "| kind | shape | arithmetic | tokens | old | new | new / old |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {c['kind']} | {c['shape']} | {c['arithmetic']} | {c['tokens']} | {c['old_ms']:.3f} | {c['new_ms']:.3f} | "
              f"{c['ratio']:.2f} |" for c in cells]
    return "\n".join(lines)


def main() -> None:
    parser = cli(__doc__, RESULTS / "house")
    parser.add_argument("--base", default="HEAD", help="the git revision whose kernel is the old one (default HEAD)")
    parser.add_argument("--path", default=None, choices=PATHS[:-1], help="the path timed (default: SPECDRAFT_KERNEL_PATH)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--name", default="kernel_ab")
    args = parser.parse_args()
    path = args.path or chosen_path()
    with tempfile.TemporaryDirectory() as tmp:
        old_source = revision_source(args.base, Path(tmp))
        builds = {p: (Kernel(build(p, old_source)), Kernel(build(p))) for p in PATHS}
        differ = {p: bitwise(*pair) for p, pair in builds.items()}
        cells = timed(*builds[path], args.rounds)
        shared = {kind.name for kind in shared_kinds(builds[path][0])}
    added = [kind.name for kind in native.KINDS.values() if kind.name not in shared]
    results = {"machine": machine(), "base": args.base, "path": path, "bitwise": differ, "times": cells, "added": added}
    write_results(args.out, args.name, results, report(args.base, path, args.rounds, differ, cells, added))


if __name__ == "__main__":
    main()
