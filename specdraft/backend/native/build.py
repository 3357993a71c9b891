"""Building the compiled kernel: every source under `csrc/` compiled at first use by the machine's C++
compiler (the one torch's inductor needs) for this machine's instructions, once per source, compiler,
CPU and build path, and cached under the cache dir."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from specdraft.params import cache_dir

CSRC = Path(__file__).parent / "csrc"  # where the package data puts the sources


def sources(source: Path = CSRC) -> list[Path]:
    """The kernel's files under `source`: its C++ sources, compiled together, and the headers they include."""
    return sorted(source.glob("*.cpp")) + sorted(source.glob("*.h"))


def cxx() -> str | None:
    """The C++ compiler the kernel is built with (CXX, else the first on PATH; None: there is none)."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _machine() -> str:
    """What `-march=native` compiles for here: the CPU's model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "\n".join(lines)


# What a build may run: the best this CPU has, that in 256-bit registers only, AVX2 alone, loops.
PATHS = ("native", "ymm", "avx2", "portable")
PATH_VARIABLE = "SPECDRAFT_KERNEL_PATH"  # the path the library, CLI, server and benchmarks run


def chosen_path() -> str:
    """The build path this process runs (`PATHS`): `SPECDRAFT_KERNEL_PATH`, "native" where unset. On a
    machine with AVX-512, "avx2" runs the code an AVX2-only CPU (a Zen 3, Intel's client cores) runs,
    so that its timings and its sums can be taken anywhere."""
    path = os.environ.get(PATH_VARIABLE, "").strip().lower() or "native"
    if path not in PATHS:
        raise ValueError(f"{PATH_VARIABLE} must be one of {', '.join(PATHS)}, got {os.environ[PATH_VARIABLE]!r}")
    return path


def build(path: str, source: Path = CSRC) -> Path:
    """Compile the kernel (`csrc/`'s sources) for this machine, once per source, compiler and CPU;
    return the shared library's path. `path`: "native", everything the CPU's flags offer
    (`-march=native`: AVX2, and for the int8 arithmetic AVX-512 VNNI or AVX-VNNI where it has them,
    and with AVX-512 whole 16-row tiles read in 512-bit registers); "ymm", that code in 256-bit
    registers only; "avx2", the AVX2 code without VNNI, compiled as for a machine without AVX-512 (16
    vector registers); "portable", the loops every machine runs. All give bitwise the same sums; the
    others are for tests and benchmarks to compare with. `source`: where the C++ lies (another
    revision's, for a benchmark to compare with: `benchmarks.cpu.kernel_ab`)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
    compiler = cxx()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"]
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
    # "avx2" as a machine without AVX-512 compiles it: 16 vector registers, no VNNI.
    flags += {"native": [], "ymm": ["-DSPECDRAFT_NO_ZMM"], "avx2": ["-DSPECDRAFT_NO_VNNI"] + ["-mno-avx512f"] * x86,
              "portable": ["-DSPECDRAFT_PORTABLE"]}[path]
    files = sources(source)  # every source and header: a change to any is a new build
    texts = [f"{file.name}\0{file.read_text()}" for file in files]
    key = hashlib.sha256("\0".join([*texts, version, _machine(), *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"native-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            compiled = [str(file) for file in files if file.suffix == ".cpp"]
            result = subprocess.run([compiler, *flags, *compiled, "-o", str(built)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling the kernel ({source}) failed: {result.stderr.strip()[-2000:]}")
            os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target
