"""A start-up calibration kept and replayed (`engine.calibrate.KeptCalibration`): the next start with
the same key tells the policy the same costs without running a pass; a changed key, `recalibrate`,
an unreadable file or static shapes measure again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from specdraft.drafters import create_drafter
from specdraft.engine import Engine
from specdraft.engine.calibrate import KeptCalibration
from specdraft.policy import DraftingTiming, StepReport, VerifyTiming
from specdraft.runtime import calibration_key, kept_calibration
from specdraft.settings import Settings
from specdraft.verifier import Verifier
from tests.helpers.tiny import ToyTokenizer, loaded, make_tiny_model


def engine(model: torch.nn.Module, kept: KeptCalibration | None, **verifier) -> Engine:
    drafters = {"ngram": create_drafter("ngram", k=3)}
    return Engine(Verifier(model, **verifier), drafters, ToyTokenizer(), (), 256, k=3, max_batch=2, calibration=kept)


def costs(e: Engine) -> dict:
    """What the policy was told of the verify passes: each cell's timings."""
    return {cell: list(times.recent) for cell, times in e.policy.costs.verify.items()}


def test_a_kept_calibration_is_replayed_without_a_pass(tmp_path):
    model = make_tiny_model(dtype=torch.float32)
    kept = KeptCalibration(tmp_path / "kept.json", {"what": "a test"})
    first = engine(model, kept)
    assert first.calibration == "measured" and kept.path.is_file()
    assert json.loads(kept.path.read_text())["key"] == {"what": "a test"}
    second = engine(model, kept)
    assert second.calibration == "kept"
    assert second.verifier.forward_seconds == 0.0  # not one pass ran
    assert costs(second) == costs(first) and costs(first)


def test_recalibrate_measures_again_and_keeps_what_it_measured(tmp_path):
    model = make_tiny_model(dtype=torch.float32)
    kept = KeptCalibration(tmp_path / "kept.json", {})
    engine(model, kept)
    before = kept.path.read_text()
    again = engine(model, KeptCalibration(kept.path, {}, afresh=True))
    assert again.calibration == "measured" and again.verifier.forward_seconds > 0
    assert kept.path.read_text() != before  # timings differ run to run: written again
    assert engine(model, kept).calibration == "kept"


@pytest.mark.parametrize("content", ["{not json", '{"version": 1, "reports": [{"verify": {"lengths": "x"}}]}',
                                     '{"version": 0, "reports": []}'])
def test_an_unreadable_or_older_file_is_measured_afresh_and_replaced(tmp_path, caplog, content):
    path = tmp_path / "kept.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="specdraft"):
        e = engine(make_tiny_model(dtype=torch.float32), KeptCalibration(path, {}))
    assert e.calibration == "measured"
    assert json.loads(path.read_text())["version"] == KeptCalibration.VERSION
    assert ("unreadable" in caplog.text) == (content != '{"version": 0, "reports": []}')


def test_reports_come_back_as_they_were_told(tmp_path):
    kept = KeptCalibration(tmp_path / "kept.json", {})
    reports = [StepReport(verify=VerifyTiming((5, 0), 0.25)),
               StepReport(drafting=(DraftingTiming("model", 5, 0.1, 0.02, 30, 0.3),))]
    kept.save(reports)
    assert kept.load() == reports
    assert KeptCalibration(kept.path, {}, afresh=True).load() is None
    assert KeptCalibration(tmp_path / "none.json", {}).load() is None


def test_a_read_only_cache_only_costs_the_next_start_a_measurement(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    kept = KeptCalibration(blocker / "kept.json", {})  # its folder cannot be made
    with caplog.at_level(logging.WARNING, logger="specdraft"):
        kept.save([StepReport(verify=VerifyTiming((0,), 0.1))])
    assert "could not keep" in caplog.text and kept.load() is None


def test_static_shapes_are_always_measured(tmp_path):
    from specdraft.backend import StaticShapes

    model = make_tiny_model(dtype=torch.float32)
    kept = KeptCalibration(tmp_path / "kept.json", {})
    engine(model, kept)
    static = engine(model, kept, static=StaticShapes(max_rows=2, max_context=64, graphs=False))
    assert static.calibration == "measured"  # its passes warm its shapes up: they must run


def test_the_key_names_what_the_costs_depend_on(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CALIBRATION_DIR", str(tmp_path))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    plan = Settings(device="cpu", weights="dense").resolve(str(model))
    kept = kept_calibration(plan)
    assert kept.path.parent == tmp_path and not kept.afresh
    assert kept.key == calibration_key(plan) and kept.key["threads"] == torch.get_num_threads()
    assert kept.key["target"]["file"][1] == 4  # the file by its size (and time of change)
    for other in (Settings(device="cpu", weights="dense", k=3), Settings(device="cpu", weights="dense", max_batch=2),
                  Settings(device="cpu", weights="dense", drafters=["none"])):
        assert kept_calibration(other.resolve(str(model))).path != kept.path
    model.write_bytes(b"GGUF2")  # another file at the same path
    assert kept_calibration(plan).path != kept.path
    assert kept_calibration(Settings(device="cpu", weights="dense", recalibrate=True).resolve(str(model))).afresh


def test_a_model_that_came_loaded_is_measured_every_start(tmp_path):
    target = loaded(make_tiny_model(dtype=torch.float32))
    assert kept_calibration(Settings().resolve(target)) is None
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    draft = Settings(device="cpu", weights="dense", drafters=["model"], draft_model=target)
    assert kept_calibration(draft.resolve(str(model))) is None  # nothing names the draft's weights
    by_path = Settings(device="cpu", weights="dense", drafters=["model"], draft_model=model)
    assert kept_calibration(by_path.resolve(str(model))).key["draft"]["file"][1] == 4  # the draft file by its size


def test_recalibrate_must_be_a_bool():
    with pytest.raises(ValueError, match="recalibrate must be True or False"):
        Settings(recalibrate="yes")
