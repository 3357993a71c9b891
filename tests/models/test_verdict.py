"""`specdraft models FILE.gguf`: for a local file, whether it loads here, which of its weights run natively
(read as its own blocks) and why the rest do not, from its header alone (`specdraft.models.verdict`)."""

from __future__ import annotations

import pytest

from benchmarks.cpu.kind_files import SHAPES, write_kind_file
from specdraft.api import cli
from specdraft.backend import native

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verdict")
    made = {kind: write_kind_file(folder / f"{kind}.gguf", kind, SHAPES["small"]) for kind in ("Q5_1", "TQ2_0")}
    truncated = folder / "truncated.gguf"
    truncated.write_bytes(made["Q5_1"].read_bytes()[:100_000])
    return {**made, "truncated": truncated}


def test_a_file_of_native_kinds_runs_natively(files, capsys):
    assert cli.main(["models", str(files["Q5_1"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{files['Q5_1']}: llama, 16 weight tensors"
    assert out[1].startswith("  read as the file's blocks: 14 in Q5_1 (") and "2 in Q8_0" in out[1]
    expected = "  natively: yes" if native.kernel_problem() is None else "  natively: no, not on this machine: "
    assert out[-1].startswith(expected)


def test_weights_in_other_kinds_are_named_with_why_and_what_is_read(files, capsys):
    assert cli.main(["models", str(files["TQ2_0"]), str(files["truncated"])]) == 0
    out = capsys.readouterr().out.splitlines()
    kinds = ", ".join(kind.name for kind in native.KINDS.values())
    assert out[2].startswith("  loaded as float32 copies: 14 in TQ2_0 (")
    assert out[2].endswith(f": TQ2_0 is not a kind the kernel reads (it reads {kinds})")
    if native.kernel_problem() is None:
        assert out[3] == "  natively: partly: the float32 copies above run dense (more memory a token, slower)"
    assert out[4].startswith(f"{files['truncated']}: does not load: tensor ") and "past the end of the file" in out[4]


def test_a_path_that_is_no_file_is_one_line_and_nonzero(tmp_path, capsys):
    assert cli.main(["models", str(tmp_path / "missing.gguf")]) != 0
    assert f"{tmp_path / 'missing.gguf'} is not a file: give the path of a .gguf model file" in capsys.readouterr().err


def test_a_native_load_says_in_one_line_which_weights_load_as_float32_copies(files, caplog):
    from specdraft.models import load_model

    with caplog.at_level("WARNING", logger="specdraft"):
        load_model(str(files["TQ2_0"]), device="cpu", dtype="float32", weights="native")
    notes = [r.getMessage() for r in caplog.records if "float32 copies" in r.getMessage()]
    assert notes == [f"TQ2_0.gguf: 14 weights load as float32 copies, not native blocks: 14 in TQ2_0 (0.3 MB): TQ2_0 is not "
                     f"a kind the kernel reads (it reads {', '.join(k.name for k in native.KINDS.values())})"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="specdraft"):
        load_model(str(files["Q5_1"]), device="cpu", dtype="float32", weights="native")
    assert not any("float32 copies" in r.getMessage() for r in caplog.records)
