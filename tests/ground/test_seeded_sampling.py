"""A seed reproduces a sampled request's tokens whatever else is in the batch: alone, in batches of
2 and 8 whose rows draft different lengths and join and leave, and whatever its own drafts are
(deterministic drafts never change a seeded row's output)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specdraft.drafters import create_drafter
from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier
from tests.helpers.tiny import TINY_VOCAB, ToyTokenizer, make_tiny_model

TARGET_PROMPT = [7, 3, 7, 3, 11, 42]
TARGET = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=1234)
K = 5


class MixedDrafter:
    """Per request, by its prompt: the seeded request drafts its known continuation (`truth`) with
    random corruptions and random lengths; every other request drafts random tokens of random lengths."""

    def __init__(self, truth: list[int] | None, seed: int) -> None:
        self.truth, self.rng = truth, random.Random(seed)
        self.contexts: dict[str, list[int]] = {}

    def begin(self, request_id, prompt_ids, params):
        self.contexts[request_id] = list(prompt_ids)

    def propose(self, request_ids, max_lengths):
        drafts = []
        for request_id, limit in zip(request_ids, max_lengths):
            context = self.contexts[request_id]
            n = self.rng.randint(0, limit)
            if self.truth is not None and context[: len(TARGET_PROMPT)] == TARGET_PROMPT:
                done = len(context) - len(TARGET_PROMPT)
                tokens = [t if self.rng.random() < 0.7 else (t + 1) % TINY_VOCAB for t in self.truth[done : done + n]]
            else:
                tokens = [self.rng.randrange(TINY_VOCAB) for _ in range(n)]
            drafts.append(Draft(np.asarray(tokens, dtype=np.int32)) if tokens else EMPTY_DRAFT)
        return drafts

    def accept(self, request_id, token_ids):
        self.contexts[request_id].extend(token_ids)

    def end(self, request_id):
        del self.contexts[request_id]


def decode(model, drafter, others: list[tuple[list[int], SamplingParams]], max_batch: int, join_after: int) -> list[int]:
    """Run `others`, submit the seeded request after `join_after` steps, and return its tokens."""
    engine = Engine(Verifier(model), {"test": drafter}, ToyTokenizer(), (), 256, k=K, max_batch=max_batch, policy="fixed")
    for prompt, params in others:
        engine.submit(prompt, params)
    for _ in range(join_after):
        engine.step()
    target = engine.submit(TARGET_PROMPT, TARGET)
    while engine.has_work:
        engine.step()
    return engine.collect(target).token_ids


def other_requests(n: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        prompt = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(1, 12))]
        sampled = i % 2 == 0
        params = SamplingParams(max_tokens=rng.randint(3, 30), temperature=1.0 if sampled else 0.0, top_k=20 if i % 4 == 0 else 0,
                                seed=rng.randrange(1000) if sampled else None)
        requests.append((prompt, params))
    return requests


@pytest.fixture(scope="module")
def tiny_model():
    """Less sharp than the shared tiny model, so that sampling at temperature 0.8 has real choices."""
    return make_tiny_model(seed=1, sharpen=6.0)


@pytest.fixture(scope="module")
def alone(tiny_model) -> list[int]:
    """The reference: the seeded request decoded alone with plain decoding (no drafts)."""
    return decode(tiny_model, create_drafter("none"), [], max_batch=1, join_after=0)


def test_reference_is_a_real_sample(tiny_model, alone):
    assert len(alone) == TARGET.max_tokens
    engine = Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, k=K, max_batch=1)
    [different] = engine.run([(TARGET_PROMPT, SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, seed=4321))])
    assert different.token_ids != alone  # the seed matters, so the equalities below can fail
    assert len(set(alone)) > 10  # a varied sample, not a near-greedy loop


@pytest.mark.parametrize("drafter_seed", [0, 1, 2])
def test_own_drafts_do_not_change_the_output(tiny_model, alone, drafter_seed):
    assert decode(tiny_model, MixedDrafter(alone, drafter_seed), [], max_batch=1, join_after=0) == alone


def test_ngram_drafts_do_not_change_the_output(tiny_model, alone):
    assert decode(tiny_model, create_drafter("ngram", k=K), [], max_batch=1, join_after=0) == alone


@pytest.mark.parametrize(
    "batch, others, join_after",
    [(2, 1, 0), (2, 3, 2), (8, 7, 0), (8, 20, 3), (4, 12, 1)],  # more requests than rows: rows join and leave
)
def test_batch_does_not_change_the_output(tiny_model, alone, batch, others, join_after):
    drafter = MixedDrafter(alone, seed=batch * 100 + others)
    assert decode(tiny_model, drafter, other_requests(others, seed=others), batch, join_after) == alone
