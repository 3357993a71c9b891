"""The drafter contract as the engine uses it: a drafter with only the four verbs works and is priced
by measurement, one whose calls do not pay is not called, a drafter's failures stay its own
requests', options reach a composite's parts (cross-request memory reaches `hybrid`), the `fixed`
policy drafts every step, and the engine reads drafters only through what the contract declares."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from specdraft.drafters.base import EMPTY_DRAFT, Draft, parts_of
from specdraft.engine import Engine
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.policy import CostModel
from specdraft.runtime import build_runtime
from specdraft.settings import Settings
from specdraft.verifier import Verifier
from tests.helpers.tiny import ToyTokenizer, hf_greedy, loaded, make_tiny_model, shallow_copy_of

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 42, 9, 9, 13], [33, 34, 35, 33, 34, 35, 33, 34], [70, 71, 72, 73, 70, 71, 72, 73, 70, 71]]


class LastOccurrence:
    """Four verbs and nothing else: copies what followed the previous occurrence of the last token."""

    def __init__(self, k: int = 4, wrong: bool = False, sleep: float = 0.0) -> None:
        self.k, self.wrong, self.sleep = k, wrong, sleep
        self.contexts: dict[str, list[int]] = {}
        self.calls = 0

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.contexts[request_id] = list(prompt_ids)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        self.calls += 1
        time.sleep(self.sleep)
        drafts = []
        for request_id, limit in zip(request_ids, max_lengths):
            context = self.contexts[request_id]
            at = max((i for i in range(len(context) - 1) if context[i] == context[-1]), default=None)
            tokens = [] if at is None else context[at + 1 : at + 1 + min(limit, self.k)]
            if self.wrong:
                tokens = [(t + 1) % 100 for t in tokens]
            drafts.append(Draft(np.asarray(tokens, dtype=np.int32)) if tokens else EMPTY_DRAFT)
        return drafts

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.contexts[request_id].extend(token_ids)

    def end(self, request_id: str) -> None:
        del self.contexts[request_id]


class FlatVerify(CostModel):
    """A verify pass costs 5 ms at any width, whatever this machine measures: drafting pays unless a
    drafter's own call costs more than its drafts gain."""

    def observe_verify(self, batch, tokens, seconds):
        pass

    def verify_seconds(self, batch, tokens):
        return 0.005


def test_an_undeclared_drafter_is_one_measured_part():
    drafter = LastOccurrence()
    parts = parts_of(drafter)
    assert parts.free is drafter and parts.free_cost == "measured" and parts.costly is None


def test_a_drafter_with_only_the_four_verbs_drafts_and_is_priced_by_its_calls(tiny_model):
    engine = Engine(Verifier(tiny_model), {"four": LastOccurrence()}, ToyTokenizer(), (), 256, k=4, max_batch=2)
    engine.policy.costs = FlatVerify()
    done = engine.run([(p, SamplingParams(max_tokens=24)) for p in PROMPTS])
    for prompt, completion in zip(PROMPTS, done):
        assert completion.token_ids == hf_greedy(tiny_model, prompt, 24)
    assert sum(c.metrics.draft_tokens for c in done) > 0 and sum(c.metrics.accepted_tokens for c in done) > 0
    assert engine.policy.costs.call_seconds("four") is not None  # its calls were timed
    assert "four" not in engine.policy.costs.drafting  # ... and not priced as a costly part


def test_a_measured_drafter_whose_calls_do_not_pay_is_skipped(tiny_model):
    slow = LastOccurrence(wrong=True, sleep=0.03)  # 30 ms a call for drafts that are never accepted
    engine = Engine(Verifier(tiny_model), {"slow": slow}, ToyTokenizer(), (), 256, k=4, max_batch=1)
    engine.policy.costs = FlatVerify()
    [done] = engine.run([(PROMPTS[1], SamplingParams(max_tokens=60))])
    assert done.token_ids == hf_greedy(tiny_model, PROMPTS[1], 60)
    assert slow.calls < done.metrics.steps / 2, (slow.calls, done.metrics.steps)
    # With the fixed policy the same drafter is called every step: measuring a drafter as it is.
    slow.calls = 0
    [fixed] = engine.run([(PROMPTS[1], SamplingParams(max_tokens=20), SpeculationParams(policy="fixed"))])
    assert slow.calls == fixed.metrics.steps and fixed.metrics.draft_tokens > 0


def test_a_drafter_that_raises_anywhere_fails_its_own_requests_only(tiny_model):
    class Faulty(LastOccurrence):
        def __init__(self, where: str) -> None:
            super().__init__()
            self.where = where

        def begin(self, request_id, prompt_ids, params):
            super().begin(request_id, prompt_ids, params)
            if self.where == "begin":
                raise RuntimeError("begin broke")

        def propose(self, request_ids, max_lengths):
            if self.where == "propose":
                raise RuntimeError("propose broke")
            if self.where == "too long":
                return [Draft(np.arange(n + 1, dtype=np.int32)) for n in max_lengths]
            return super().propose(request_ids, max_lengths)

        def accept(self, request_id, token_ids):
            super().accept(request_id, token_ids)
            if self.where == "accept":
                raise RuntimeError("accept broke")

    for where, says in (("begin", "begin broke"), ("propose", "propose broke"), ("accept", "accept broke"),
                        ("too long", "broke its contract")):
        engine = Engine(Verifier(tiny_model), {"none": LastOccurrence(k=0), "faulty": Faulty(where)}, ToyTokenizer(), (),
                        256, k=4, max_batch=2, policy="fixed")
        bad, good = engine.run([(PROMPTS[1], SamplingParams(max_tokens=12), SpeculationParams("faulty")),
                                (PROMPTS[0], SamplingParams(max_tokens=12), SpeculationParams("none"))])
        assert bad.finish_reason == "error" and says in bad.error, (where, bad.error)
        assert good.finish_reason == "length" and good.token_ids == hf_greedy(tiny_model, PROMPTS[0], 12), where
        assert not engine.has_work


def test_the_engine_reads_drafters_only_through_the_contract():
    files = sorted((ROOT / "specdraft" / "engine").glob("*.py"))
    assert len(files) >= 5
    for path in files:
        tree = ast.parse(path.read_text())
        probes = [node.func.id for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")]
        assert probes == [], path.name


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=11, layers=4, sharpen=12.0)
    return loaded(target), loaded(shallow_copy_of(target, keep=[0, 3]))


def hybrid_runtime(pair, memory: bool):
    target, draft = pair
    options = {"ngram": {"memory": True}} if memory else None
    return build_runtime(target, Settings(drafters=["hybrid"], draft_model=draft, k=4, max_batch=1,
                                          drafter_options=options, policy="fixed", calibrate=False))


def test_ngram_memory_reaches_the_hybrids_ngram_part(pair):
    """One request teaches the memory its output; a later request whose context ends in a piece of it
    gets that piece's continuation from the hybrid's free part only when memory is on."""
    drafts = {}
    for memory in (False, True):
        runtime = hybrid_runtime(pair, memory)
        hybrid = runtime.engine.drafters["hybrid"]
        assert (hybrid.ngram.memory is not None) == memory
        [first] = runtime.engine.run([(PROMPTS[0], SamplingParams(max_tokens=40))])
        out = first.token_ids
        hybrid.begin("probe", [90, 91, *out[10:14]], SamplingParams())
        [draft] = hybrid.parts.free.propose(["probe"], [4])
        drafts[memory] = draft.token_ids.tolist()
        hybrid.end("probe")
    assert drafts[False] == []
    assert drafts[True] and drafts[True] == out[14 : 14 + len(drafts[True])]


def test_ngram_and_the_hybrids_ngram_part_share_one_memory_and_one_draft_model(pair):
    target, draft = pair
    runtime = build_runtime(target, Settings(drafters=["ngram", "model", "hybrid"], draft_model=draft, k=4, max_batch=1,
                                             drafter_options={"ngram": {"memory": True}}, calibrate=False))
    drafters = runtime.engine.drafters
    assert drafters["ngram"].memory is not None and drafters["hybrid"].ngram.memory is drafters["ngram"].memory
    assert drafters["hybrid"].model.rows.model is drafters["model"].rows.model  # one draft model, two rows of it


def test_options_for_a_drafter_not_served_are_refused_by_name(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="'model'.*not among the drafters"):
        build_runtime(target, Settings(drafters=["none", "ngram"], drafter_options={"model": {"dtype": "float32"}},
                                       calibrate=False))
    with pytest.raises(ValueError, match="no option 'max_m'"):
        build_runtime(target, Settings(drafters=["ngram"], drafter_options={"ngram": {"max_m": 3}}, calibrate=False))


def test_the_engine_owns_the_defaults_of_a_request(pair):
    """Intake resolves a request's defaults, and its drafter to the object that drafts for it."""
    target, _ = pair
    runtime = build_runtime(target, Settings(drafters=["none", "ngram"], k=3, policy="fixed", calibrate=False))
    engine = runtime.engine
    filled = engine.resolve([1, 2, 3], SamplingParams(max_tokens=4), SpeculationParams())
    assert (filled.drafter_name, filled.k, filled.policy) == ("none", 3, "fixed")
    assert filled.drafter is engine.drafters["none"] and filled.parts == engine.parts["none"]
    named = engine.resolve([1, 2, 3], SamplingParams(max_tokens=4), SpeculationParams("ngram", 2, "auto"))
    assert (named.drafter_name, named.k, named.policy, named.drafter) == ("ngram", 2, "auto", engine.drafters["ngram"])
    assert named.id != filled.id


@pytest.mark.subprocess
@pytest.mark.slow
def test_fixed_policy_accepts_a_draft_model_equal_to_the_target_in_full(embedded):
    """Through the CLI on the embedded model: the draft model is the target itself, so every draft
    token is the target's own greedy choice and each step yields k + 1 tokens."""
    k = 4
    command = [sys.executable, "-m", "specdraft.api.cli", "generate", "Count from one to twenty in words.",
               "--drafter", "model", "--draft-model", str(embedded.path), "--policy", "fixed", "-k", str(k),
               "--max-tokens", "30", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = json.loads(out.stdout)["metrics"]
    full_steps = metrics["accepted_per_step"][:-1]  # the last step may be cut by the budget
    assert metrics["acceptance_rate"] > 0.95 and sum(n == k for n in full_steps) >= 0.9 * len(full_steps), metrics
