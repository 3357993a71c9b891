"""The CLI on bad input a user or a tampered cache gives it: each case exits non-zero with one line on
stderr naming the problem, and no traceback. Every case fails before a model loads (most before
torch is imported), so the table runs in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdraft.models import find

pytestmark = pytest.mark.subprocess

DRAFTER = find.entry("qwen2.5-coder-0.5b-instruct")
REFETCH = f"re-fetch it with `specdraft models --fetch {DRAFTER.name} --force`"


def run_cli(*args: str | bytes, cache: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", SPECDRAFT_CACHE_DIR=str(cache),
               PIP_NO_INDEX="1", PIP_FIND_LINKS=str(cache), PIP_CONFIG_FILE=os.devnull)
    return subprocess.run([sys.executable, "-m", "specdraft.api.cli", *args], input=stdin, capture_output=True,
                          env=env, timeout=120)


def tampered_cache(cache: Path, record_now: bool) -> Path:
    """The drafter's file in `cache` with the catalogue's size but other bytes (sparse zeros), and a
    record saying it was verified: as the file is now (`record_now`: changed with its time of change
    put back, which only --verify finds), or as it was before it changed."""
    path = find.models_dir(cache) / DRAFTER.file
    path.parent.mkdir(parents=True)
    with open(path, "wb") as file:
        file.truncate(DRAFTER.size)
    now = path.stat()
    mtime_ns = now.st_mtime_ns if record_now else now.st_mtime_ns - 10**9
    path.with_name(path.name + ".sha256").write_text(
        f"{DRAFTER.sha256}  {path.name}\n# verified: size={now.st_size} mtime_ns={mtime_ns} inode={now.st_ino}\n")
    return path


def folder_of(tmp_path: Path) -> str:
    """Things on disk the cases name: a text file, a GGUF without its suffix, a model folder whose
    config.json is not JSON, a folder, a .gguf beside where a near name points."""
    tmp_path.mkdir()
    (tmp_path / "notes.txt").write_text("hello, not a model\n")
    (tmp_path / "model.bin").write_bytes(b"GGUF" + bytes(60))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "llama",')
    (tmp_path / "tiny-model.gguf").write_bytes(b"GGUF" + bytes(60))
    return str(tmp_path)


CASES = [
    # 5: a cached model file that changed since it was verified is refused, with the command that re-fetches it
    pytest.param(["generate", "hi", "--model", DRAFTER.name], "stale", [REFETCH, "its sha256 is not the catalogue's"],
                 id="tampered-on-use"),
    pytest.param(["serve", "--model", "qwen2.5-coder-0.5b-INSTRUCT", "--drafters", "ngram"], "stale", [REFETCH],
                 id="tampered-serve"),
    pytest.param(["generate", "hi", "--model", DRAFTER.name, "--verify"], "now", [REFETCH], id="tampered-verify"),
    pytest.param(["models", "--verify"], "now", [REFETCH], id="models-verify"),
    pytest.param(["models", "--fetch", DRAFTER.name], "stale", [REFETCH], id="fetch-without-force"),
    pytest.param(["models", "--force"], None, ["--force fetches again the models --fetch names"], id="force-alone"),
    # 6: a near name gets "did you mean" at once; a bare name that is nothing known lists the names
    pytest.param(["generate", "hi", "--model", "qwen2.5-coder-0.5b-instruc"], None,
                 ["unknown model 'qwen2.5-coder-0.5b-instruc'; did you mean 'qwen2.5-coder-0.5b-instruct'?"], id="near-name"),
    pytest.param(["generate", "hi", "--model", "SmolLM2-135M-instruc"], None, ["did you mean 'SmolLM2-135M-Instruct'?"],
                 id="near-embedded"),
    pytest.param(["serve", "--draft-model", "qwen2.5-coder-0.5b-instrct", "--drafters", "model"], None,
                 ["did you mean 'qwen2.5-coder-0.5b-instruct'?"], id="near-draft-model"),
    pytest.param(["models", "--fetch", "qwen2.5-coder-0.5b-instruc"], None,
                 ["unknown model name 'qwen2.5-coder-0.5b-instruc'", "did you mean 'qwen2.5-coder-0.5b-instruct'?"],
                 id="near-fetch"),
    pytest.param(["generate", "hi", "--model", "gpt2"], None,
                 ["unknown model 'gpt2': not a name `specdraft models` lists (qwen2.5-coder-1.5b-instruct, ",
                  "or a Hugging Face id (owner/name)"], id="bare-name"),
    pytest.param(["generate", "hi", "--model", "{TMP}/tiny-modle.gguf"], None,
                 ["model file not found: {TMP}/tiny-modle.gguf; did you mean '{TMP}/tiny-model.gguf'?"], id="near-file"),
    # 7: options of the wrong type, and --ngram-memory on what is not a memory file
    pytest.param(["generate", "hi", "--drafter-options", '{"ngram": {"max_n": "x"}}'], None,
                 ["drafter 'ngram': option 'max_n' must be an integer, got 'x'"], id="option-type"),
    pytest.param(["serve", "--drafter-options", '{"hybrid": {"ngram": {"adaptive": 1}}}'], None,
                 ["drafter 'ngram': option 'adaptive' must be true or false, got 1"], id="part-option-type"),
    pytest.param(["serve", "--ngram-memory", "{TMP}"], None, ["{TMP} is not an n-gram memory file: a directory"],
                 id="memory-directory"),
    pytest.param(["serve", "--ngram-memory", "{TMP}/notes.txt"], None, ["{TMP}/notes.txt is not an n-gram memory file ("],
                 id="memory-other-file"),
    pytest.param(["serve", "--ngram-memory", "{TMP}/no/memory.npz"], None, ["{TMP}/no is not a folder"],
                 id="memory-no-folder"),
    # 8: what a model argument is not
    pytest.param(["generate", "hi", "--model", "{TMP}/notes.txt"], None,
                 ["{TMP}/notes.txt is not a GGUF file (it starts with b'hell', not b'GGUF')"], id="text-file"),
    pytest.param(["generate", "hi", "--model", os.devnull], None,
                 [f"{os.devnull} is not a regular file (a character device)"], id="device-file"),
    pytest.param(["generate", "hi", "--model", "{TMP}/model.bin"], None, ["is a GGUF file whose name does not end in .gguf"],
                 id="gguf-without-suffix"),
    pytest.param(["generate", "hi", "--model", "{TMP}/broken"], None,
                 ["{TMP}/broken/config.json is malformed: not JSON ("], id="malformed-config"),
    pytest.param(["generate", "hi", "--model", ""], None, ["the model name is empty"], id="empty-model"),
    pytest.param(["serve", "--model", " ", "--drafters", "ngram"], None, ["the model name is empty"],
                 id="blank-model-serve"),
    pytest.param(["generate", "hi", "--device", "tpu"], None,
                 ["device must be cpu or cuda (cuda:N for the Nth GPU), got 'tpu'"], id="device"),
    # 9: the CLI's temperature bound is the server's
    pytest.param(["generate", "hi", "--temperature", "3"], None, ["--temperature must be between 0 and 2, got 3"],
                 id="temperature"),
    pytest.param(["generate", "hi", "--temperature", "nan"], None, ["--temperature must be between 0 and 2, got nan"],
                 id="temperature-nan"),
    # text that is not UTF-8: Python keeps each undecodable byte of argv as a lone surrogate
    pytest.param(["generate", b"caf\xe9"], None, ["the prompt is not valid UTF-8: the byte 0xe9 at character 3"],
                 id="argv-not-utf8"),
    pytest.param(["generate", "hi", "--stop", b"\xff"], None, ["a --stop string is not valid UTF-8: the byte 0xff at character 0"],
                 id="stop-not-utf8"),
]


@pytest.mark.parametrize("args, cached, messages", CASES)
def test_each_bad_input_is_one_line_and_nonzero(tmp_path, args, cached, messages):
    files = folder_of(tmp_path / "files")  # {TMP} in a case
    args = [arg.replace("{TMP}", files) if isinstance(arg, str) else arg for arg in args]
    if cached is not None:
        tampered_cache(tmp_path / "cache", record_now=cached == "now")
    proc = run_cli(*args, cache=tmp_path / "cache")
    stderr = proc.stderr.decode(errors="replace")
    lines = stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, stderr
    assert lines[0].startswith("specdraft: error: "), stderr
    for message in messages:
        assert message.replace("{TMP}", files) in lines[0]
    assert "Traceback" not in stderr + proc.stdout.decode(errors="replace")


def test_a_tampered_file_is_kept_for_the_user_and_its_record_untouched(tmp_path):
    """Refusing a changed file neither deletes it nor records it as verified: every use refuses it."""
    path = tampered_cache(tmp_path / "cache", record_now=False)
    record = path.with_name(path.name + ".sha256").read_text()
    for _ in range(2):
        assert run_cli("generate", "hi", "--model", DRAFTER.name, cache=tmp_path / "cache").returncode == 1
    assert path.stat().st_size == DRAFTER.size and path.with_name(path.name + ".sha256").read_text() == record


def test_stdin_that_is_not_utf8_is_one_line(tmp_path):
    proc = run_cli("generate", "-", cache=tmp_path, stdin=b"ab\xe9cd")
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == "specdraft: error: the prompt (stdin) is not valid UTF-8: the byte 0xe9 at character 2"


def test_models_verify_hashes_the_embedded_model(tmp_path):
    """The embedded model's pinned sha256 is its file's: `models --verify` says so, and exits 0."""
    proc = run_cli("models", "--verify", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "verified: SmolLM2-135M-Instruct" in proc.stderr.decode()
