"""Every option has one owner and is never silently dropped: draft lengths out of range, unknown
drafter options and out-of-vocabulary drafts are refused with a message that names them."""

from __future__ import annotations

import numpy as np
import pytest

from specdraft.drafters import create_drafter, drafter_options
from specdraft.drafters.base import Draft
from specdraft.engine import Engine
from specdraft.params import MAX_SPECULATIVE_TOKENS, SamplingParams, SpeculationParams
from specdraft.verifier import Verifier
from tests.helpers.tiny import TINY_VOCAB, ScriptedDrafter, ToyTokenizer, hf_greedy
from tests.helpers.cli import run_cli


@pytest.mark.parametrize("k, message", [(-1, "between 0 and 64, got -1"), (65, "between 0 and 64, got 65"),
                                        (2.5, "must be an integer, got 2.5"), (True, "must be an integer, got True")])
def test_draft_length_out_of_range_is_refused_everywhere(k, message):
    with pytest.raises(ValueError, match=message):
        SpeculationParams(drafter="ngram", num_speculative_tokens=k)
    with pytest.raises(ValueError, match=message):
        create_drafter("ngram", k=k)


def test_draft_length_bounds_are_accepted():
    assert SpeculationParams(num_speculative_tokens=0).num_speculative_tokens == 0
    assert create_drafter("ngram", k=MAX_SPECULATIVE_TOKENS).k == MAX_SPECULATIVE_TOKENS
    assert create_drafter("prompt-lookup-scan", k=0).propose  # k = 0: drafts nothing, but is a drafter


@pytest.mark.parametrize("value, message", [("65", "--num-speculative-tokens must be between 0 and 64, got 65"),
                                            ("-2", "--num-speculative-tokens must be between 0 and 64, got -2"),
                                            ("five", "--num-speculative-tokens must be an integer, got 'five'")])
def test_cli_refuses_bad_draft_length(value, message):
    proc = run_cli("generate", "hi", "-k", value)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"specdraft: error: argument -k/--num-speculative-tokens: {message}"]


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("ngram", {"max_ngram": 3}, "drafter 'ngram' has no option 'max_ngram'; its options: eos_token_ids, max_n, "),
        ("none", {"max_n": 3}, "drafter 'none' has no option 'max_n'; its options: none"),
        ("prompt-lookup-scan", {"draft_model": "x"}, "drafter 'prompt-lookup-scan' has no option 'draft_model'; its options: min_n, max_n"),
        ("magic", {}, "unknown drafter 'magic'; choose one of: "),
    ],
)
def test_unknown_drafter_option_is_refused(name, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        create_drafter(name, k=3, **options)


def test_prompt_lookup_scan_takes_its_ngram_sizes():
    assert drafter_options("prompt-lookup-scan") == ["min_n", "max_n"]
    drafter = create_drafter("prompt-lookup-scan", k=4, min_n=2, max_n=5)
    assert (drafter.k, drafter.min_n, drafter.max_n) == (4, 2, 5)
    with pytest.raises(ValueError, match="need 1 <= min_n <= max_n, got min_n=3, max_n=2"):
        create_drafter("prompt-lookup-scan", k=4, min_n=3, max_n=2)


def test_engine_refuses_a_bad_maximum_draft_length(tiny_model):
    with pytest.raises(ValueError, match="k must be between 0 and 64, got 65"):
        Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, k=65)


@pytest.mark.parametrize("bad", [TINY_VOCAB, -1, 10**6])
def test_out_of_vocabulary_draft_fails_its_request_alone(tiny_model, bad):
    """A drafter proposing an id outside the vocabulary fails that request with a clear error; the
    other requests in the same batch finish with their exact greedy output."""
    prompts = [[5, 17, 42, 9], [1, 2, 3], [60, 61]]
    poisoned = tuple(prompts[1])

    def script(context, limit):
        return [bad, 3] if tuple(context[:3]) == poisoned and len(context) > 4 else []

    engine = Engine(Verifier(tiny_model), {"scripted": ScriptedDrafter(script)}, ToyTokenizer(), (), 256, k=4, max_batch=3,
                    policy="fixed")
    done = engine.run([(p, SamplingParams(max_tokens=12)) for p in prompts])
    assert done[1].finish_reason == "error"
    assert f"draft token id {bad} is outside the vocabulary (0..{TINY_VOCAB - 1})" in done[1].error
    assert 0 < len(done[1].token_ids) < 12  # what it had generated before the bad draft is kept
    for i in (0, 2):
        assert done[i].finish_reason == "length" and done[i].error is None
        assert done[i].token_ids == hf_greedy(tiny_model, prompts[i], 12)


def test_bad_draft_probabilities_fail_their_request_and_the_engine_goes_on(tiny_model):
    """A draft is checked in one place, the engine's step: bad probabilities fail that request (never an
    exception out of the step), and the engine serves the next request."""
    import torch

    class BadProbabilities(ScriptedDrafter):
        def propose(self, request_ids, max_lengths):
            return [Draft(np.array([4, 5][:n], dtype=np.int32), torch.full((min(n, 2), TINY_VOCAB - 1), 0.01))
                    if n else Draft() for n in max_lengths]

    engine = Engine(Verifier(tiny_model), {"bad": BadProbabilities(lambda c, n: []), "none": create_drafter("none")},
                    ToyTokenizer(), (), 256, k=4, policy="fixed")
    [failed] = engine.run([([1, 2, 3], SamplingParams(max_tokens=8, temperature=1.0, seed=1))])
    assert failed.finish_reason == "error"
    assert "draft probabilities have shape (2, 95), expected (2, 96)" in failed.error
    [fine] = engine.run([([1, 2, 3], SamplingParams(max_tokens=8))], SpeculationParams("none"))
    assert fine.token_ids == hf_greedy(tiny_model, [1, 2, 3], 8)


def test_engine_refuses_unknown_drafter_and_too_long_drafts(tiny_model):
    engine = Engine(Verifier(tiny_model), {"none": create_drafter("none"), "ngram": create_drafter("ngram", k=4)},
                    ToyTokenizer(), (), 256, k=4)
    from specdraft.errors import RequestError

    with pytest.raises(RequestError, match="drafter 'model' is not available here; choose one of: ngram, none"):
        engine.submit([1, 2], SamplingParams(), SpeculationParams("model"))
    with pytest.raises(RequestError, match="num_speculative_tokens 5 is above this engine's maximum of 4"):
        engine.submit([1, 2], SamplingParams(), SpeculationParams("ngram", 5))
    request = engine.submit([1, 2, 1, 2], SamplingParams(max_tokens=3), SpeculationParams("ngram", 0))
    while engine.has_work:
        engine.step()
    assert engine.collect(request).metrics.draft_tokens == 0  # k = 0: plain decoding
