"""Intra-op threads that behave on a shared or busy host.

A CPU step runs a hundred or more parallel regions (numba's kernels, `backend/numba_layers/`,
run on torch's OpenMP runtime: its libgomp is loaded first, so numba's calls resolve to it). Between
two regions a worker thread waits, and how it waits matters:
- with OpenMP's default (spinning for milliseconds) a thread that finished its share spins on a
  core that, beside another busy process, the working thread needs: a step slows down severalfold;
- passive waiting (sleep at once) keeps a step near its fair share on a busy host, but every region
  then wakes a sleeping thread, tens of microseconds in a VM: a large share of a quiet step;
- spinning briefly (`GOMP_SPINCOUNT=2000`) and then sleeping, the default, keeps the worker awake
  between the regions of a step (microseconds apart) and asleep between steps and while a busy
  neighbour holds the core.
`benchmarks/results/cpu/cpu_floor.md` measures each setting quiet and beside one busy process.

OpenMP reads these variables once, when torch loads it, and numba its pool size when it is imported:
so they cannot wait until a runtime is built (by then torch is loaded). `configure()` runs in one
place, `specdraft/__init__.py`, which every use of specdraft imports first, and only sets what the
environment leaves unset. Numba's pool size is fixed when numba is
imported, so a thread count (`OMP_NUM_THREADS`) is also given to numba (`NUMBA_NUM_THREADS`): a pool
larger than the threads it runs keeps idle threads that compete with the working one on a busy host.
Importing torch before specdraft keeps torch's defaults. `SPECDRAFT_THREADS=<setting>` picks another
of `THREAD_SETTINGS` (the benchmark uses it to compare them).

The instructions the libraries dispatch to are read as they load too: under `SPECDRAFT_KERNEL_PATH=avx2`
(the compiled kernel's AVX2 build, `native.build.chosen_path`) `configure()` also holds torch, MKL,
oneDNN, OpenBLAS and numba to AVX2 (`AVX2_LIBRARIES`, where unset), so that a machine with AVX-512 runs
a whole step as an AVX2-only CPU does: its timings and its sums.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings

# name -> the environment it sets; "torch" is torch's own defaults (libgomp spins at barriers).
THREAD_SETTINGS: dict[str, dict[str, str]] = {
    "brief-spin": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "2000"},  # GOMP_SPINCOUNT wins over the policy
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "torch": {},
    "one-thread": {"OMP_NUM_THREADS": "1"},
}
DEFAULT_SETTING = "brief-spin"
THREAD_VARIABLES = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "NUMBA_NUM_THREADS")
AVX2_LIBRARIES = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "OPENBLAS_CORETYPE": "Haswell", "NUMBA_CPU_NAME": "haswell"}  # what an AVX2-only x86 runs


def configure() -> str | None:
    """Apply the chosen setting's variables where the environment has none (a waiting policy or spin
    count of the user's own leaves both alone); return its name, or None when torch was imported
    first (too late for OpenMP to see them)."""
    name = os.environ.get("SPECDRAFT_THREADS", DEFAULT_SETTING)
    if name not in THREAD_SETTINGS:
        warnings.warn(f"SPECDRAFT_THREADS={name!r} is not a thread setting (one of: {', '.join(THREAD_SETTINGS)}); "
                      f"using {DEFAULT_SETTING!r}", RuntimeWarning, stacklevel=2)
        name = DEFAULT_SETTING
    if "torch" in sys.modules:
        return None
    waiting = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # one choice: a spin count overrides the policy
    user_waits = any(key in os.environ for key in waiting)
    for key, value in THREAD_SETTINGS[name].items():
        if not (user_waits and key in waiting):
            os.environ.setdefault(key, value)
    if "OMP_NUM_THREADS" in os.environ and "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    if os.environ.get("SPECDRAFT_KERNEL_PATH", "").strip().lower() == "avx2" and platform.machine() in ("x86_64", "AMD64"):
        for key, value in AVX2_LIBRARIES.items():
            os.environ.setdefault(key, value)
    return name
