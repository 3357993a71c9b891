"""One resolver of an engine's settings: `Settings.resolve` decides every default (each drafter's
options, a composite's parts' included; the model's device, dtype, weights and arithmetic) into one
`Resolved` value that `build_runtime` builds as it is, and the CLI's flags default to the library's."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest
import torch

from specdraft.backend.native import library as kernel_library
from specdraft.models import LoadedModel
from specdraft.params import DEFAULT_MAX_BATCH, DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_POLICY
from specdraft.params import SamplingParams
from specdraft.settings import ONE_REQUEST, Settings, default, server_drafters


def no_kernel():
    raise RuntimeError("no C++ compiler found")


@pytest.fixture
def kernel(monkeypatch):
    """The block kernel present (whether it compiles here is `test_blocks`'s question)."""
    monkeypatch.setattr(kernel_library, "kernel", lambda: object())


@pytest.fixture
def gguf(tmp_path) -> str:
    path = tmp_path / "m.gguf"
    path.touch()  # resolving reads no byte of it
    return str(path)


@pytest.fixture
def hf_dir(tmp_path) -> str:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    return str(tmp_path / "hf")


def loading(model: str, **options):
    return Settings(**options).resolve(model).loading


# -- weights and arithmetic ---------------------------------------------------------------------------
@pytest.mark.parametrize("options, weights, arithmetic", [
    ({}, "native", "int8"),  # a GGUF on CPU in float32: its blocks, in int8
    ({"arithmetic": "float32"}, "native", "float32"),
    ({"arithmetic": "int8"}, "native", "int8"),
    ({"weights": "dense"}, "dense", "float32"),
    ({"weights": "native", "arithmetic": "float32"}, "native", "float32"),
    ({"enforce_eager": True}, "dense", "float32"),  # eager layers would dequantise every block every pass
    ({"enforce_eager": True, "weights": "native"}, "native", "int8"),  # auto: int8 where native weights load
    ({"dtype": "bfloat16"}, "dense", "float32"),  # native weights compute in float32
])
def test_a_gguf_on_cpu_loads_as_settings_resolve_it(kernel, gguf, options, weights, arithmetic):
    got = loading(gguf, device="cpu", **options)
    assert (got.weights, got.arithmetic, got.device, got.gguf) == (weights, arithmetic, torch.device("cpu"), Path(gguf))
    assert got.few_rows_linears and got.int8_asked == (options.get("arithmetic") == "int8")


def test_a_gguf_without_the_block_kernel_loads_dense_and_native_says_why(monkeypatch, gguf):
    monkeypatch.setattr(kernel_library, "kernel", no_kernel)
    got = loading(gguf, device="cpu")
    assert (got.weights, got.arithmetic) == ("dense", "float32")
    with pytest.raises(ValueError, match=r"--weights native: the block kernel is not available here: no C\+\+ compiler"):
        loading(gguf, device="cpu", weights="native")


def test_a_hugging_face_directory_loads_dense_in_float32_and_int8_or_native_say_why(kernel, hf_dir):
    got = loading(hf_dir, device="cpu")
    assert (got.weights, got.arithmetic, got.dtype, got.gguf) == ("dense", "float32", torch.float32, None)
    with pytest.raises(ValueError, match="--weights native: the model is not a GGUF file"):
        loading(hf_dir, device="cpu", weights="native")
    with pytest.raises(ValueError, match="--arithmetic int8 computes on a GGUF's blocks read natively: "
                                         "the model is not a GGUF file"):
        loading(hf_dir, device="cpu", arithmetic="int8")


def test_int8_on_weights_that_cannot_be_native_says_why(kernel, gguf):
    with pytest.raises(ValueError, match="read natively: native weights compute in float32, not bfloat16"):
        loading(gguf, device="cpu", dtype="bfloat16", arithmetic="int8")
    with pytest.raises(ValueError, match="read natively: native weights run on CPU, not cuda"):
        loading(gguf, device="cuda", arithmetic="int8")


@pytest.mark.parametrize("cuda, device, dtype, few_rows", [(True, "cuda", torch.bfloat16, False),
                                                           (False, "cpu", torch.float32, True)])
def test_the_device_is_cuda_where_present_and_the_dtype_follows_it(kernel, monkeypatch, gguf, cuda, device, dtype, few_rows):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    got = loading(gguf)
    assert (got.device, got.dtype, got.few_rows_linears) == (torch.device(device), dtype, few_rows)
    assert (got.weights, got.arithmetic) == (("dense", "float32") if cuda else ("native", "int8"))
    assert loading(gguf, device=device, dtype="float32").dtype == torch.float32  # given: as given


def test_a_loaded_model_is_not_loaded_again():
    target = LoadedModel(torch.nn.Linear(1, 1), None, "loaded", Path("."), 2048, ())
    assert Settings(weights="dense").resolve(target).loading is None


# -- the engine's defaults ----------------------------------------------------------------------------
def test_the_defaults_resolve_to_one_value(kernel, gguf):
    plan = Settings(device="cpu").resolve(gguf)
    assert plan.drafters == ("ngram",) and plan.default_drafter == "ngram"
    assert (plan.k, plan.max_batch, plan.policy) == (DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_MAX_BATCH, DEFAULT_POLICY)
    assert plan.compiled and plan.calibrate and plan.prefix_cache_bytes == 1024 << 20
    assert (plan.context(2048), plan.max_context) == (2048, None)  # the model's own
    assert plan.context(131072, 4096) == 4096  # a LongRoPE model's original context (its short factors)
    plan = Settings(device="cpu", max_context=100, enforce_eager=True, prefix_cache_mb=0).resolve(gguf)
    assert (plan.context(2048), plan.context(50), plan.compiled, plan.prefix_cache_bytes) == (100, 50, False, 0)
    assert Settings(device="cpu", max_context=8192).resolve(gguf).context(131072, 4096) == 8192  # asked: served


def test_the_engine_and_the_settings_share_their_defaults():
    from specdraft.engine import Engine

    engine = inspect.signature(Engine).parameters
    settings = Settings()
    assert settings.max_batch == engine["max_batch"].default == DEFAULT_MAX_BATCH == 16
    assert settings.k == engine["k"].default and settings.policy == engine["policy"].default


def test_the_default_drafter_is_the_first_given():
    assert Settings().resolve_drafter_options() == {"ngram": {}}
    assert Settings(drafter="none", drafters=["ngram", "none"]).served == ["none", "ngram"]
    assert Settings(drafters=["none", "ngram"]).served == ["none", "ngram"]


# -- drafter options ----------------------------------------------------------------------------------
def test_a_composite_gets_its_parts_options_through_the_parts_own_path():
    options = Settings(drafters=["ngram", "model", "hybrid"], draft_model="draft.gguf", dtype="float32",
                       drafter_options={"ngram": {"max_n": 3, "memory": True},
                                        "model": {"window": 64}}).resolve_drafter_options()
    assert options["ngram"] == {"max_n": 3, "memory": True}
    assert options["model"] == {"window": 64}  # the draft model is planned as the target is, not passed as an option
    assert options["hybrid"] == {"ngram": options["ngram"], "model": options["model"]}


def test_a_composite_alone_gets_its_parts_options_and_may_name_its_own():
    alone = Settings(drafters=["hybrid"], drafter_options={"ngram": {"max_n": 3}}).resolve_drafter_options()
    assert alone == {"hybrid": {"ngram": {"max_n": 3}, "model": {}}}
    own = Settings(drafters=["ngram", "hybrid"], drafter_options={"ngram": {"max_n": 3, "memory": True},
                                                                   "hybrid": {"ngram": {"max_n": 2}}})
    assert own.resolve_drafter_options()["hybrid"]["ngram"] == {"max_n": 2, "memory": True}
    assert own.resolve(LoadedModel(None, None, "x", Path("."), 8, ())).drafter_options == own.resolve_drafter_options()


def test_drafter_options_for_no_drafter_built_are_refused_by_name():
    with pytest.raises(ValueError, match="drafter options name 'model', which is not among the drafters: none"):
        Settings(drafters=["none"], drafter_options={"model": {"dtype": "float32"}})


# -- the CLI's defaults are the library's -------------------------------------------------------------
def test_the_clis_defaults_are_the_librarys():
    from specdraft.api.cli import build_parser, settings_from

    parser = build_parser()
    assert settings_from(parser.parse_args(["serve"])) == Settings()
    assert settings_from(parser.parse_args(["generate", "hi"])) == Settings(**ONE_REQUEST)
    generate = parser.parse_args(["generate", "hi"])  # and a request's: what fits, as SamplingParams
    assert (generate.max_tokens, generate.temperature) == (SamplingParams().max_tokens, SamplingParams().temperature)
    fields = {name for name in Settings.__dataclass_fields__}
    for command in ("generate", "serve"):
        sub = parser._subparsers._group_actions[0].choices[command]
        for action in sub._actions:
            if action.dest in fields:  # a flag for a field leaves it to the field's default, or says it
                assert action.default in (argparse.SUPPRESS, default(action.dest)), (command, action.dest)


def test_a_server_builds_every_built_in_and_plugin_the_default_first():
    served = server_drafters()
    assert served[:4] == ["ngram", "none", "model", "hybrid"] and served[0] == Settings().default_drafter


# -- the draft model is planned and loaded as the target is ---------------------------------------------
@pytest.mark.skipif(kernel_library.kernel_problem() is not None, reason="no block kernel: weights are dense anyway")
def test_the_draft_model_is_planned_by_the_targets_rules():
    from specdraft.models.find import SELF_DRAFT

    settings = Settings(drafters=["ngram", "model"], draft_model="SmolLM2-135M-Instruct", device="cpu")
    plan = settings.resolve()
    assert (plan.draft.weights, plan.draft.arithmetic, plan.draft.device) == ("native", "int8", torch.device("cpu"))
    for changes, weights, arithmetic in (({"enforce_eager": True}, "dense", "float32"),
                                         ({"weights": "dense"}, "dense", "float32"),
                                         ({"arithmetic": "float32"}, "native", "float32")):
        draft, target = (lambda p: (p.draft, p.loading))(settings.replace(**changes).resolve())
        assert (draft.weights, draft.arithmetic) == (target.weights, target.arithmetic) == (weights, arithmetic), changes
    assert Settings(drafters=["hybrid"]).resolve().draft == SELF_DRAFT
    assert Settings(drafters=["ngram", "none"]).resolve().draft is None


def test_the_runtime_loads_the_draft_model_once_as_planned_and_its_drafters_draft_with_it():
    from specdraft.runtime import build_runtime

    settings = Settings(drafters=["model", "hybrid"], draft_model="SmolLM2-135M-Instruct", device="cpu",
                        weights="dense", max_batch=1, calibrate=False)
    runtime = build_runtime(None, settings)
    draft = runtime.resources.draft
    assert (draft.weights, draft.arithmetic) == ("dense", "float32") and draft.model is not runtime.target.model
    engine_drafters = runtime.engine.drafters
    assert engine_drafters["model"].rows.model is draft.model
    assert engine_drafters["hybrid"].parts.costly.rows.model is draft.model
