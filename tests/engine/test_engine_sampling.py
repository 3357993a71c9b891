"""Sampling through the whole engine (tiny model): the token after a verified draft is distributed
as the target's marginal, computed exactly; a biased engine (always accept) fails the same check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier
from specdraft.sampling import inverse_cdf
from specdraft.verifier import verifier as verifier_module
from tests.helpers.tiny import TINY_VOCAB, ScriptedDrafter, ToyTokenizer

pytestmark = pytest.mark.slow
PROMPT = [5, 17, 42, 9]
TEMPERATURE = 2.0
RUNS = 20_000


@pytest.fixture(scope="module")
def exact(tiny_model):
    """p(t1 | prompt), p(t2 | prompt, t1) for every t1, and the marginal of t2."""
    with torch.inference_mode():
        first = (tiny_model(torch.tensor([PROMPT], device=tiny_model.device)).logits[0, -1] / TEMPERATURE).softmax(-1)
        batch = torch.tensor([PROMPT + [t] for t in range(TINY_VOCAB)], device=tiny_model.device)
        second = (tiny_model(batch).logits[:, -1] / TEMPERATURE).softmax(-1)  # [t1, t2]
    return first, second, first @ second


def sample_second_tokens(tiny_model, second) -> np.ndarray:
    likely = second.argmax(-1).tolist()  # the drafter guesses the most likely t2 given t1
    drafter = ScriptedDrafter(lambda context, limit: [likely[context[-1]]] if len(context) == len(PROMPT) + 1 else [])
    engine = Engine(Verifier(tiny_model), {"scripted": drafter}, ToyTokenizer(), (), 256, k=1, max_batch=256, policy="fixed")
    # max_tokens 3: the prefill gives t1, leaving room for a one-token draft (and a bonus) after it.
    done = engine.run([(PROMPT, SamplingParams(max_tokens=3, temperature=TEMPERATURE, seed=s)) for s in range(RUNS)])
    assert all(c.metrics.draft_tokens == 1 for c in done)  # every run verified a draft
    return np.array([c.token_ids[1] for c in done])


def tvd(samples: np.ndarray, dist: torch.Tensor) -> float:
    empirical = np.bincount(samples, minlength=TINY_VOCAB) / len(samples)
    return 0.5 * float(np.abs(empirical - dist.double().cpu().numpy()).sum())


def test_engine_sampling_matches_target_marginal(tiny_model, exact):
    _, second, marginal = exact
    assert tvd(sample_second_tokens(tiny_model, second), marginal) < 0.03  # sampling noise at 20k runs is ~0.017


def test_negative_control_always_accepting_fails(tiny_model, exact, monkeypatch):
    _, second, marginal = exact
    def accept_everything(p, following, u, row_of, starts, q=None, probabilistic=None):
        accepted = torch.zeros_like(starts).index_add_(0, row_of, (following >= 0).long())  # every draft token
        at = starts + accepted  # each row's last position: then an honest bonus draw
        bonus = inverse_cdf(p[at], u[at, 0])
        return torch.where(torch.arange(len(following)) < at[row_of], following, bonus[row_of]), accepted

    monkeypatch.setattr(verifier_module, "rejection_sample", accept_everything)
    assert tvd(sample_second_tokens(tiny_model, second), marginal) > 0.1
