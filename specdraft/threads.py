"""Intra-op threads that behave on a shared or busy host.

A CPU step runs hundreds of small parallel regions. With OpenMP's default waiting policy, a thread
that finishes its share spins at the barrier; when another process competes for the cores, the
spinning threads take the time slices the working thread needs, and a step slows down by up to 10x.
Passive waiting (threads sleep at barriers) costs little on a quiet machine and keeps a step near
its fair share when the machine is busy (`benchmarks/results/cpu_floor.md` measures each setting).

OpenMP reads these variables once, when torch loads it: `configure()` runs when `specdraft` is
imported, and only sets what the environment leaves unset. Numba's thread pool (the CPU step's
kernels, `backend/numba_layers.py`) runs on OpenMP too and follows the same settings; its size is
fixed when numba is imported, so a thread count (`OMP_NUM_THREADS`) is also given to numba
(`NUMBA_NUM_THREADS`): a pool larger than the threads it runs keeps idle threads that compete with
the working one on a busy host. Importing torch before specdraft keeps
torch's defaults. `SPECDRAFT_THREADS=<setting>` picks another of `THREAD_SETTINGS` (the benchmark
uses it to compare them).
"""

from __future__ import annotations

import os
import sys
import warnings

# name -> the environment it sets; "torch" is torch's own defaults (libgomp spins at barriers).
THREAD_SETTINGS: dict[str, dict[str, str]] = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "short-spin": {"GOMP_SPINCOUNT": "10000"},
    "torch": {},
    "one-thread": {"OMP_NUM_THREADS": "1"},
}
DEFAULT_SETTING = "passive"
THREAD_VARIABLES = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "NUMBA_NUM_THREADS")


def configure() -> str | None:
    """Apply the chosen setting's variables where the environment has none; return its name, or
    None when torch was imported first (too late for OpenMP to see them)."""
    name = os.environ.get("SPECDRAFT_THREADS", DEFAULT_SETTING)
    if name not in THREAD_SETTINGS:
        warnings.warn(f"SPECDRAFT_THREADS={name!r} is not a thread setting (one of: {', '.join(THREAD_SETTINGS)}); "
                      f"using {DEFAULT_SETTING!r}", RuntimeWarning, stacklevel=2)
        name = DEFAULT_SETTING
    if "torch" in sys.modules:
        return None
    for key, value in THREAD_SETTINGS[name].items():
        os.environ.setdefault(key, value)
    if "OMP_NUM_THREADS" in os.environ and "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    return name
