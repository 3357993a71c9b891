"""What every benchmark shares: where results go, the machine they ran on, a command line with its
`--out`, writing a report (`name`.json with every figure, `name`.md with the tables), the time of a
verifier step by draft length (the CPU and GPU step benchmarks), and a `specdraft serve` process to
measure through (loopback only)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

    from specdraft.verifier import Verifier

RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    """The CPU's model name and instruction kind (and the kernel path where `SPECDRAFT_KERNEL_PATH`
    chooses one), its cores, and the accelerator (or the CPU threads torch uses)."""
    import torch

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            if cpu and flags:
                break
    except OSError:
        pass
    kind = next((name for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2 only"))
                 if flag in flags), None)
    path = os.environ.get("SPECDRAFT_KERNEL_PATH")
    cpu += "".join(f" ({part})" for part in (kind, path and f"SPECDRAFT_KERNEL_PATH={path}") if part)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU only, {torch.get_num_threads()} threads"
    return f"{cpu}; {os.cpu_count()} cores; {device}"


def cli(doc: str, out: Path) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring as the description (what `--help` says it measures),
    and `--out`, the folder its report goes to (`out` by default: its subject's folder under `RESULTS`,
    `benchmarks/README.md`'s index)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=out, help=f"where the report goes (default {out})")
    return parser


def write_results(out_dir: Path, name: str, results: dict, markdown: str, markdown_name: str | None = None) -> None:
    """A benchmark's report: `name`.json (every figure) and `name`.md (the tables; `markdown_name`.md
    where a hand-written `name`.md exists beside it), and the tables on stdout."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / f"{markdown_name or name}.md").write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    print(markdown)


def verify_step_times(verifier: Verifier, batch: int, ks: list[int], repeats: int,
                      rng: np.random.Generator) -> list[dict]:
    """Step times for every k at this batch size, the ks interleaved within each repeat so that the
    machine's drift hits them alike; every step starts from the same cache lengths."""
    import statistics

    import numpy as np

    from specdraft.drafters.base import Draft
    from specdraft.verifier import Batch

    rows = verifier.row_ids[:batch]
    assert len(rows) == batch
    lengths = {r: verifier.length(r) for r in rows}
    totals: dict[int, list[float]] = {k: [] for k in ks}
    forwards: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats + 1):
        for k in ks:
            batched = Batch.of(rows, [42] * len(rows), [Draft(rng.integers(0, 1000, size=k).astype(np.int32)) for _ in rows])
            before = verifier.forward_seconds
            start = time.perf_counter()
            verifier.step(batched)
            totals[k].append(time.perf_counter() - start)
            forwards[k].append(verifier.forward_seconds - before)
            for r in rows:  # roll back
                verifier.truncate(r, lengths[r])
    cells = []
    for k in ks:
        total, forward = totals[k][1:], forwards[k][1:]  # the first repeat warms allocations
        cells.append({"batch": batch, "k": k, "step_ms": 1000 * statistics.median(total),
                      "forward_ms": 1000 * statistics.median(forward),
                      "outside_forward_share": 1 - sum(forward) / sum(total)})
    return cells


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, name: str, timeout: float, output: Callable[[], str]) -> None:
    """Wait until the server process `proc` answers `url`/health; raise RuntimeError with the end of
    its `output` where it exits first, or where it does not answer within `timeout` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {output()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not come up in time")
        time.sleep(0.3)


@contextmanager
def live_server(*args: str, startup_timeout: float = 300.0, log: Path | None = None, cwd: Path | None = None):
    """Yield the base URL of a `specdraft serve ARGS` process on a free loopback port; stop it (SIGINT:
    a graceful shutdown) after. cwd: the checkout whose specdraft it runs (default this one)."""
    port = free_port()
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "specdraft.api.cli", "serve", "--port", str(port), *args],
                            stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, "specdraft serve", startup_timeout,
                     lambda: proc.stderr.read().decode() if proc.stderr else (log.read_text() if log else ""))
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if log:
            out.close()


def step_stats(runs: list[dict]) -> dict:
    """What verification costs over runs of the engine (each with its metrics' `steps`,
    `draft_tokens` and `accepted_tokens`): emitted tokens per target step, drafted tokens per step
    and accepted per drafted token."""
    steps = sum(r["steps"] for r in runs)
    drafted, accepted = sum(r["draft_tokens"] for r in runs), sum(r["accepted_tokens"] for r in runs)
    return {"tokens_per_step": (steps + accepted) / steps if steps else 0.0,
            "drafted_per_step": drafted / steps if steps else 0.0,
            "accepted_per_drafted": accepted / drafted if drafted else 0.0}


def step_columns(cell: dict) -> str:
    """`step_stats` as three markdown table cells."""
    return f"{cell['tokens_per_step']:.2f} | {cell['drafted_per_step']:.2f} | {cell['accepted_per_drafted']:.2f}"
