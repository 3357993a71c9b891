"""The library's arguments refused by name before anything loads: `LLM`'s model and device, drafter
options of the wrong type (a part's too), an n-gram memory path that is no memory file; and a
context asked beyond the model's is served at the model's with a warning saying so; a temperature
beyond the server's bound."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from specdraft.drafters import check_options
from specdraft.drafters.memory import NgramMemory, open_saved
from specdraft.llm import LLM
from specdraft.models import LoadedModel
from specdraft.params import SamplingParams
from specdraft.settings import Settings


def test_llm_names_a_bad_model_or_device():
    with pytest.raises(TypeError, match="model must be a name or path \\(str\\), a LoadedModel or None, got int: 123"):
        LLM(model=123)
    with pytest.raises(ValueError, match="^device must be cpu or cuda \\(cuda:N for the Nth GPU\\), got 'tpu'$"):
        LLM(device="tpu")
    assert Settings(device="cuda:1").device == "cuda:1" and Settings(device="cpu").device == "cpu"


@pytest.mark.parametrize("drafter, options, message", [
    ("ngram", {"max_n": "x"}, "drafter 'ngram': option 'max_n' must be an integer, got 'x'"),
    ("ngram", {"max_n": 4.0}, "option 'max_n' must be an integer, got 4.0"),
    ("ngram", {"max_n": True}, "option 'max_n' must be an integer, got True"),
    ("ngram", {"adaptive": 1}, "option 'adaptive' must be true or false, got 1"),
    ("ngram", {"memory_path": 3}, "option 'memory_path' must be a string or None (null), got 3"),
    ("model", {"vocabulary": 1.5}, "option 'vocabulary' must be an integer, a string or None (null), got 1.5"),
    ("hybrid", {"ngram": {"min_confidence": "high"}}, "drafter 'ngram': option 'min_confidence' must be a number"),
])
def test_an_option_of_the_wrong_type_is_refused_naming_it(drafter, options, message):
    with pytest.raises(ValueError) as error:
        check_options(drafter, options)
    assert message in str(error.value)
    with pytest.raises(ValueError, match="must be"):  # through LLM too, before anything loads
        LLM(drafters=[drafter], drafter_options={drafter: options})


@pytest.mark.parametrize("drafter, options", [
    ("ngram", {"max_n": 3, "min_confidence": 1, "adaptive": False, "memory_path": None}),  # an integer is a number
    ("model", {"vocabulary": "auto", "window": None, "prefix_cache_mb": 0}),
])
def test_options_of_their_declared_types_pass(drafter, options):
    check_options(drafter, options)


def test_a_memory_path_that_is_no_memory_file_is_refused(tmp_path):
    saved = tmp_path / "memory.npz"
    NgramMemory(capacity=16).save(saved)
    open_saved(saved).close()
    assert NgramMemory.load(saved).capacity == 16
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "notes.txt").write_text("not a memory")
    for path, why in [(tmp_path, ": a directory"), (tmp_path / "notes.txt", " (a NumPy archive"),
                      (tmp_path / "array.npy", " (a NumPy archive")]:
        with pytest.raises(ValueError, match=f"^{path} is not an n-gram memory file{why.replace('(', '[(]')}"):
            NgramMemory.load(path)


def test_a_context_beyond_the_models_is_cut_with_a_warning(caplog):
    loaded = LoadedModel(None, None, "x", Path("."), 8192, ())
    with caplog.at_level(logging.WARNING, logger="specdraft"):
        assert Settings(max_context=1_000_000).resolve(loaded).context(8192) == 8192
        assert Settings(max_context=4096).resolve(loaded).context(8192) == 4096
    assert [r.getMessage() for r in caplog.records] == [
        "max_context (--max-model-len) 1000000 is more than the model's context: serving 8192 tokens"]


@pytest.mark.parametrize("temperature", [-0.5, 2.5, 100.0])
def test_the_library_bounds_temperature_as_the_server_and_cli_do(temperature):
    with pytest.raises(ValueError, match=f"temperature must be between 0 and 2, got {temperature!r}"):
        SamplingParams(temperature=temperature)
    assert SamplingParams(temperature=2.0).temperature == 2.0
