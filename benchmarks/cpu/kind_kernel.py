"""One projection of the kernel alone, per block kind and pass width: random blocks of a kind (a
1.5B-shaped matrix), its tiles, and the int8 arithmetic's call on 1 and 6 tokens, 20 calls x 7 rounds,
medians in ms, on the kernel path `SPECDRAFT_KERNEL_PATH` names (or `--path`).

    python -m benchmarks.cpu.kind_kernel [--path avx2] [--kinds Q4_K:8960x1536,Q6_K:1536x8960]
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.common import RESULTS, cli
from specdraft.backend import native
from specdraft.backend.numba_layers import NO_RESIDUAL, project


def synthetic_blocks(rng, kind: native.BlockKind, rows: int, width: int) -> np.ndarray:
    """Random bytes [rows, row bytes] of `kind`'s blocks, but for its float16 fields: random finite values
    of a weight's scale (random bits would give infinities and NaNs); a kind of float weights (F16, BF16),
    random finite weights of that size (float16's smallest among them subnormal). The kernel's tests read
    them too."""
    if kind.number in native.FLOATS:
        import torch

        values = torch.from_numpy(rng.standard_normal((rows, width)).astype(np.float32) * 0.01)
        return values.to(native.FLOATS[kind.number]).view(torch.uint8).numpy()
    b = rng.integers(0, 256, (rows, width // kind.weights, kind.bytes), dtype=np.uint8)
    for at in kind.float16_at:
        b[..., at : at + 2] = (rng.standard_normal(b.shape[:2]) * 0.01).astype(np.float16)[..., None].view(np.uint8)
    return b.reshape(rows, -1)


def time_projection(kernel: native.Kernel, tiles: np.ndarray, kind: int, x: np.ndarray) -> float:
    """Median ms of one projection of x through the tiles."""
    y = np.empty((x.shape[0], tiles.shape[0]), np.float32)
    weights = (tiles, np.zeros(0, np.float32), np.zeros(tiles.shape[0], np.float32), kind)
    calls = kernel.calls("int8")
    project(weights, x, y, NO_RESIDUAL, calls)
    times = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(20):
            project(weights, x, y, NO_RESIDUAL, calls)
        times.append((time.perf_counter() - started) / 20 * 1000)
    return statistics.median(times)


def main() -> None:
    parser = cli(__doc__, RESULTS / "cpu")
    parser.add_argument("--path", default=None, help="the kernel path (default: SPECDRAFT_KERNEL_PATH, else native)")
    parser.add_argument("--kinds", default="Q4_K:8960x1536,Q6_K:1536x8960")
    args = parser.parse_args()
    kernel, rng = native.kernel(args.path), np.random.default_rng(0)
    by_name = {kind.name: kind for kind in native.KINDS.values()}
    for item in args.kinds.split(","):
        name, shape = item.split(":")
        rows, width = map(int, shape.split("x"))
        kind = by_name[name]
        tiles = kernel.tile(synthetic_blocks(rng, kind, rows, width), kind.number)
        for n in (1, 6):
            ms = time_projection(kernel, tiles, kind.number, rng.standard_normal((n, width)).astype(np.float32))
            print(f"{kernel.code} {name} {rows}x{width}, {n} token(s): {ms:.2f} ms")


if __name__ == "__main__":
    main()
