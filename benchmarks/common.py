"""What every benchmark shares: where results go, the machine they ran on, writing a report
(`name`.json with every figure, `name`.md with the tables), and a `specdraft serve` process to
measure through (loopback only)."""

from __future__ import annotations

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

RESULTS = Path(__file__).parent / "results"


def machine() -> str:
    """The CPU's model name, its cores, and the accelerator (or the CPU threads torch uses)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU only, {torch.get_num_threads()} threads"
    return f"{cpu}; {os.cpu_count()} cores; {device}"


def write_results(out_dir: Path, name: str, results: dict, markdown: str, markdown_name: str | None = None) -> None:
    """A benchmark's report: `name`.json (every figure) and `name`.md (the tables; `markdown_name`.md
    where a hand-written `name`.md exists beside it), and the tables on stdout."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / f"{markdown_name or name}.md").write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    print(markdown)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(*args: str, startup_timeout: float = 300.0, log: Path | None = None):
    """Yield the base URL of a `specdraft serve ARGS` process on a free loopback port; stop it (SIGINT:
    a graceful shutdown) after."""
    import httpx

    port = free_port()
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "specdraft.api.cli", "serve", "--port", str(port), *args],
                            stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    try:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else (log.read_text() if log else "")
                raise RuntimeError(f"specdraft serve exited with {proc.returncode}: {err[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("specdraft serve did not come up in time")
            time.sleep(0.3)
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
