"""The vLLM `Proposer` built from fake vLLM configs (no vLLM needed): which drafter runs and with which
options (vLLM's `additional_config`, else environment variables), refusals that name the bad value,
drafters that need a second model refused, and the checkpoint form vLLM loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdraft.integrations.vllm import ENV_DRAFTER, ENV_OPTIONS, Proposer, drafter_choice, vllm_model_dir
from tests.helpers.vllm_config import fake_vllm_config


def test_proposer_runs_ngram_by_default_with_the_models_eos(monkeypatch):
    monkeypatch.delenv(ENV_DRAFTER, raising=False)
    monkeypatch.delenv(ENV_OPTIONS, raising=False)
    proposer = Proposer(fake_vllm_config(k=4, eos=[7, 8]))
    drafter = proposer.rows.drafter
    assert proposer.drafter_name == "ngram" and drafter.k == 4 and drafter.eos.tolist() == [7, 8]
    tokens = np.zeros((2, 256), dtype=np.int32)
    context = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    tokens[0, : len(context)] = context
    drafts = proposer.propose([[3], []], np.array([len(context), 0]), tokens)
    assert drafts == [[4, 5, 6, 1], []]  # the copy of what followed 1 2 3; nothing for the prefilling row
    proposer.load_model(object())  # vLLM's CPU runner calls it


def test_proposer_reads_drafter_and_options_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_DRAFTER, "prompt-lookup-scan")
    monkeypatch.setenv(ENV_OPTIONS, '{"min_n": 2, "max_n": 4}')
    drafter = Proposer(fake_vllm_config()).rows.drafter
    assert (drafter.k, drafter.min_n, drafter.max_n) == (4, 2, 4)


def test_additional_config_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_DRAFTER, "prompt-lookup-scan")
    config = fake_vllm_config(additional_config={"specdraft": {"drafter": "ngram", "options": {"max_n": 3}}})
    proposer = Proposer(config)
    assert proposer.drafter_name == "ngram" and proposer.rows.drafter.max_n == 3


@pytest.mark.parametrize(
    "additional_config, environ, message",
    [
        ({}, {ENV_OPTIONS: "{max_n: 3}"}, f"{ENV_OPTIONS} must be a JSON object, got '{{max_n: 3}}'"),
        ({}, {ENV_OPTIONS: "[3]"}, f"{ENV_OPTIONS} must be a JSON object of drafter options, got \\[3\\]"),
        ({}, {ENV_DRAFTER: ""}, f"{ENV_DRAFTER} must be a drafter name, got ''"),
        ({"specdraft": "ngram"}, {}, "additional_config\\['specdraft'\\] must be an object"),
        ({"specdraft": {"drafer": "ngram"}}, {}, "has no key 'drafer'; its keys: drafter, options"),
    ],
)
def test_bad_choice_is_refused_with_its_source_named(additional_config, environ, message):
    with pytest.raises(ValueError, match=message):
        drafter_choice(additional_config, environ)


def test_unknown_drafter_and_unknown_option_are_refused(monkeypatch):
    monkeypatch.setenv(ENV_DRAFTER, "magic")
    with pytest.raises(ValueError, match="unknown drafter 'magic'; choose one of: "):
        Proposer(fake_vllm_config())
    monkeypatch.setenv(ENV_DRAFTER, "ngram")
    monkeypatch.setenv(ENV_OPTIONS, '{"max_ngram": 3}')
    with pytest.raises(ValueError, match="drafter 'ngram' has no option 'max_ngram'"):
        Proposer(fake_vllm_config())


def test_drafters_that_need_a_second_model_are_refused(monkeypatch):
    import specdraft.drafters.registry as registry

    def needs_model(k: int, target, draft_model: str = "x"):
        raise AssertionError("never built")

    registry.drafter_names()  # the built-in drafters first
    monkeypatch.setitem(registry._REGISTRY, "test-needs-model", needs_model)
    needing = [name for name in registry.drafter_names() if registry.needs_target(name)]
    assert "test-needs-model" in needing and not {"ngram", "none", "prompt-lookup-scan"} & set(needing)
    for name in needing:  # also `model` and `hybrid`, where registered
        monkeypatch.setenv(ENV_DRAFTER, name)
        with pytest.raises(ValueError, match=f"drafter '{name}' needs a second model.*use one of: .*ngram"):
            Proposer(fake_vllm_config())


def test_checkpoint_with_the_tied_embedding_as_lm_head_gets_a_vllm_form(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "converted"
    source.mkdir()
    embedding, norm = torch.arange(12.0).reshape(4, 3), torch.ones(3)
    save_file({"lm_head.weight": embedding, "model.norm.weight": norm}, str(source / "model.safetensors"))
    (source / "config.json").write_text('{"tie_word_embeddings": true}')
    target = vllm_model_dir(source)
    assert target != source and (target / "config.json").read_text() == '{"tie_word_embeddings": true}'
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["model.embed_tokens.weight", "model.norm.weight"]
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), embedding)
    assert vllm_model_dir(source) == target  # written once
    assert vllm_model_dir(target) == target  # already in vLLM's form: as it is
    assert vllm_model_dir(tmp_path) == tmp_path  # no single-file checkpoint: as it is
