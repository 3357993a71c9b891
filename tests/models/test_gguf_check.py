"""A bad GGUF (truncated, corrupted, of a kind or family specdraft does not read) is refused with one
error naming the file and the problem, before transformers or the block kernel reads it: tested on
a tiny valid file, cut short and edited byte by byte."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from specdraft.errors import BadModelFileError, ModelNotFoundError
from specdraft.models.gguf_check import FILE_FAMILIES, READ_KINDS, check_gguf

ROWS, WIDTH = 8, 64
TENSORS = {  # name -> kind; the two projections' names have the same length (the duplicate-name edit)
    "token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_1", "blk.0.attn_k.weight": "Q4_1",
    "output_norm.weight": "F32",
}
CATALOGUE = Path("~/.cache/specdraft/catalogue").expanduser()
REAL = ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]


def write_tiny(path: Path, architecture: str = "llama") -> Path:
    """A small GGUF as a model's looks: scalars, a string and its arrays of strings and numbers, then
    tensors of three kinds."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_name("tiny")
    writer.add_token_list([f"tok{i}" for i in range(ROWS)])
    writer.add_token_scores([0.0] * ROWS)
    for name, kind in TENSORS.items():
        if kind == "F32":
            writer.add_tensor(name, rng.standard_normal(WIDTH).astype(np.float32))
            continue
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        blocks = gguf.quants.quantize(rng.standard_normal((ROWS, WIDTH)).astype(np.float32), qtype)
        writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def edited(tiny: Path, tmp_path: Path, at: int, new: bytes) -> Path:
    data = bytearray(tiny.read_bytes())
    data[at:at + len(new)] = new
    out = tmp_path / "edited.gguf"
    out.write_bytes(bytes(data))
    return out


def cut(tiny: Path, tmp_path: Path, size: int) -> Path:
    out = tmp_path / "truncated.gguf"
    out.write_bytes(tiny.read_bytes()[:size])
    return out


def info_at(tiny: Path, name: str) -> int:
    """Where a tensor's info continues after its name (its dimension count)."""
    raw = name.encode()
    return tiny.read_bytes().index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)


def refused(path: Path, *words: str) -> BadModelFileError:
    with pytest.raises(BadModelFileError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert message.startswith(f"bad model file {path}: "), message
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return caught.value


def test_a_valid_file_passes_with_gguf_readers_layout(tiny):
    layout = check_gguf(tiny)
    assert (layout.version, layout.architecture, layout.alignment) == (3, "llama", 32)
    reader = gguf.GGUFReader(str(tiny))
    assert [(t.name, t.kind.name, layout.data_start + t.offset, t.nbytes) for t in layout.tensors] == [
        (t.name, t.tensor_type.name, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
    assert layout.data_start % 32 == 0 and layout.size == tiny.stat().st_size


def test_a_qwen2_file_passes(tmp_path):
    assert {"qwen2", "qwen3", "gemma3"} <= set(FILE_FAMILIES)
    assert check_gguf(write_tiny(tmp_path / "qwen.gguf", "qwen2")).architecture == "qwen2"


def test_the_error_is_a_model_error_the_edges_report(tiny, tmp_path):
    error = refused(cut(tiny, tmp_path, 10), "truncated")
    assert isinstance(error, ModelNotFoundError)  # the CLI and server report these in one line
    assert error.path == str(tmp_path / "truncated.gguf") and "truncated" in error.problem


@pytest.mark.parametrize("where, words", [
    (lambda layout, size: 0, ["too short", "truncated"]),
    (lambda layout, size: 3, ["too short"]),
    (lambda layout, size: 10, ["ends inside its header", "truncated"]),
    (lambda layout, size: 40, ["ends inside its metadata (", "truncated"]),
    (lambda layout, size: layout.data_start - 200, ["ends inside its tensor infos (4 tensors)", "truncated"]),
    (lambda layout, size: layout.data_start - 40, ["ends inside its tensor infos (tensor 4 of 4", "truncated"]),
    (lambda layout, size: layout.data_start, ["'token_embd.weight'", "past the end of the file", "truncated"]),
    (lambda layout, size: size - 1, ["'output_norm.weight'", "past the end of the file", "truncated"]),
], ids=["empty", "in-magic", "in-header", "in-metadata", "in-tensor-infos", "in-last-tensor-info", "no-data", "in-data"])
def test_a_truncated_file_is_named_truncated(tiny, tmp_path, where, words):
    layout = check_gguf(tiny)
    size = where(layout, tiny.stat().st_size)
    assert size < tiny.stat().st_size
    refused(cut(tiny, tmp_path, size), *words)


def test_a_file_cut_inside_a_string_array_names_the_key(tiny, tmp_path):
    at = tiny.read_bytes().index(b"tok5")
    refused(cut(tiny, tmp_path, at), "ends inside its metadata", "'tokenizer.ggml.tokens'", "truncated")


def test_every_cut_of_the_header_is_refused_by_name(tiny, tmp_path):
    layout = check_gguf(tiny)
    for size in range(0, layout.data_start, 7):
        refused(cut(tiny, tmp_path, size), "truncated")


def test_not_a_gguf(tiny, tmp_path):
    refused(edited(tiny, tmp_path, 0, b"GGML"), "not a GGUF file", "b'GGML'")


@pytest.mark.parametrize("version, words", [
    (1, ["GGUF version 1 is not supported"]), (4, ["GGUF version 4 is not supported"]),
    (3 << 24, ["a big-endian GGUF is not supported"]),
])
def test_an_unsupported_version(tiny, tmp_path, version, words):
    refused(edited(tiny, tmp_path, 4, struct.pack("<I", version)), *words)


def test_a_tensor_of_an_unknown_type(tiny, tmp_path):
    at = info_at(tiny, "blk.0.attn_q.weight") + 4 + 2 * 8  # past its dimension count and two dimensions
    refused(edited(tiny, tmp_path, at, struct.pack("<I", 99)), "'blk.0.attn_q.weight'", "type 99, not a GGML type")


def test_a_block_kind_nothing_reads(tiny, tmp_path):
    assert gguf.GGMLQuantizationType.I8 not in READ_KINDS
    at = info_at(tiny, "blk.0.attn_q.weight") + 4 + 2 * 8
    refused(edited(tiny, tmp_path, at, struct.pack("<I", gguf.GGMLQuantizationType.I8)),
            "'blk.0.attn_q.weight'", "block kind I8", "neither")


def test_the_kinds_read_include_the_native_readers_and_the_real_files():
    from specdraft.backend.native.formats import NAMES

    names = {kind.name for kind in READ_KINDS}
    assert set(NAMES.values()) | {"F16", "Q4_K", "Q5_0", "Q6_K"} <= names


@pytest.mark.parametrize("shift, words", [
    (10**9, ["past the end of the file", "offset is corrupted"]),
    (1, ["not a multiple of the alignment 32"]),
])
def test_a_tensor_offset_past_the_end_or_misaligned(tiny, tmp_path, shift, words):
    layout = check_gguf(tiny)
    at = info_at(tiny, "blk.0.attn_k.weight") + 4 + 2 * 8 + 4
    offset = next(t.offset for t in layout.tensors if t.name == "blk.0.attn_k.weight")
    refused(edited(tiny, tmp_path, at, struct.pack("<Q", offset + shift)), "'blk.0.attn_k.weight'", *words)


def test_a_tensor_shape_that_is_not_whole_blocks_or_dimensions(tiny, tmp_path):
    at = info_at(tiny, "blk.0.attn_q.weight")
    refused(edited(tiny, tmp_path, at + 4, struct.pack("<Q", 33)), "rows of 33 weights, not whole Q4_1 blocks of 32")
    refused(edited(tiny, tmp_path, at, struct.pack("<I", 9)), "'blk.0.attn_q.weight' has 9 dimensions")


def test_a_tensor_named_twice(tiny, tmp_path):
    at = info_at(tiny, "blk.0.attn_k.weight") - len("k.weight")
    refused(edited(tiny, tmp_path, at, b"q"), "'blk.0.attn_q.weight' appears twice")


def test_an_unknown_family(tmp_path):
    refused(write_tiny(tmp_path / "gpt2.gguf", "gpt2"), "general.architecture is 'gpt2'", "llama, mistral, qwen2, qwen3")


def test_no_architecture(tiny, tmp_path):
    at = tiny.read_bytes().index(b"general.architecture")
    refused(edited(tiny, tmp_path, at, b"general.architecturx"), "no general.architecture")


def test_a_metadata_value_of_an_unknown_type(tiny, tmp_path):
    at = tiny.read_bytes().index(b"general.name") + len(b"general.name")
    refused(edited(tiny, tmp_path, at, struct.pack("<I", 99)), "'general.name' has value type 99")


def test_a_directory_or_unreadable_path(tmp_path):
    refused(tmp_path, "cannot be read")


def test_the_embedded_model_passes():
    from specdraft.models import embedded_gguf

    layout = check_gguf(embedded_gguf())
    assert layout.architecture == "llama" and len(layout.tensors) > 100


@pytest.mark.parametrize("name", REAL)
def test_the_catalogues_files_pass_quickly(name):
    path = CATALOGUE / name
    if not path.is_file():
        pytest.skip(f"{name} is not cached")
    start = time.perf_counter()
    layout = check_gguf(path)
    assert time.perf_counter() - start < 5  # reads the header and tensor infos, never the data
    assert layout.architecture == "qwen2"
    assert layout.data_start + max(t.offset + t.nbytes for t in layout.tensors) <= layout.size


def test_load_model_refuses_a_bad_file_before_converting_it(tiny, tmp_path, monkeypatch):
    from specdraft.models import loader

    monkeypatch.setattr(loader, "convert_gguf", lambda path: pytest.fail("a bad file reached the conversion"))
    with pytest.raises(BadModelFileError, match="past the end of the file"):
        loader.load_model(str(cut(tiny, tmp_path, tiny.stat().st_size - 1)), device="cpu")


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"]])
def test_the_cli_says_one_line_and_exits_non_zero(tiny, tmp_path, capsys, command):
    from specdraft.api.cli import main

    bad = cut(tiny, tmp_path, 40)
    assert main([*command, "--model", str(bad)]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"specdraft: error: bad model file {bad}: the file ends inside its metadata")
    assert "truncated" in lines[0]
