"""The policy prices steady steps: a target whose first passes at each shape are slow, as CUDA's eager
warm-up and graph capture are, and that says so (`Forwarded.steady`), neither stops the default policy
from drafting where drafts are right nor makes it draft where they are wrong. Time is simulated (a
clock the engine reads, advanced by the target's passes), so every figure here is the same on any
machine, however busy."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from specdraft.backend import RowModel, StaticShapes
from specdraft.backend.rowmodel import Forwarded
from specdraft.drafters.ngram import NgramDrafter
from specdraft.drafters.none import NoDrafter
from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.policy import DraftPolicy, StepReport, VerifyTiming
from specdraft.verifier import Verifier
from tests.helpers.tiny import TEST_DEVICE, TINY_VOCAB, ScriptedDrafter, ToyTokenizer, hf_greedy

K = 5
STATIC = StaticShapes(max_rows=1, max_context=256, kv_block=32, graphs=False)
WARM_CALLS = 3  # slow passes at each new shape: two eager ones, then the capture
SLOW = 3.5  # what such a pass costs, in steady passes of its shape (eager launches against a graph's replay)
PROMPT = [5, 17, 42, 9, 9, 13]  # the tiny model's continuation soon repeats itself: ngram copies it
TOKENS = 120


def steady_seconds(width: int) -> float:
    """A steady verify pass of `width` tokens: a pass of k + 1 costs 1.2 plain steps (as on a GPU)."""
    return 1.0 + 0.04 * (width - 1)


class SimulatedClock:
    """The engine's clock (`time.perf_counter`), advanced only by the target's simulated passes."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowFirstPasses(RowModel):
    """A target whose verify passes take simulated time: `steady_seconds(width)`, and SLOW times that
    on the first WARM_CALLS passes at each (batch bucket, width), which it reports as not steady unless
    `hide_warm_up` (then the policy times them as the shape's cost: what it did before it was told)."""

    def __init__(self, model: torch.nn.Module, clock: SimulatedClock, hide_warm_up: bool) -> None:
        super().__init__(model, static=STATIC)
        self.clock, self.hide_warm_up = clock, hide_warm_up
        self.calls: Counter[tuple[int, int]] = Counter()
        self.spent = 0.0  # simulated seconds in verify passes

    def forward_pass(self, window, input_ids, logits_at=None) -> Forwarded:
        out = super().forward_pass(window, input_ids, logits_at)
        if logits_at is not None:  # a prefill chunk: not a verify pass, free here
            return out
        batch, width = np.shape(input_ids)
        shape = (STATIC.batch_bucket(batch), width)
        self.calls[shape] += 1
        steady = self.calls[shape] > WARM_CALLS
        seconds = steady_seconds(width) * (1.0 if steady else SLOW)
        self.clock.now += seconds
        self.spent += seconds
        return Forwarded(out.logits, steady or self.hide_warm_up)


class SlowVerifier(Verifier):
    def __init__(self, model: torch.nn.Module, clock: SimulatedClock, hide_warm_up: bool = False) -> None:
        super().__init__(model, STATIC)
        self.rows = SlowFirstPasses(model, clock, hide_warm_up)


@pytest.fixture
def clock(monkeypatch) -> SimulatedClock:
    clock = SimulatedClock()
    for module in ("step", "engine", "calibrate"):
        monkeypatch.setattr(f"specdraft.engine.{module}.time", clock)
    return clock


@pytest.fixture(scope="module")
def truth(tiny_model) -> list[int]:
    return hf_greedy(tiny_model, PROMPT, TOKENS)


def wrong_copies(truth: list[int]) -> ScriptedDrafter:
    """A drafter whose every draft fails at its first token: what copying gives where nothing can be copied."""
    return ScriptedDrafter(lambda context, limit: [(t + 1) % TINY_VOCAB
                                                   for t in truth[len(context) - len(PROMPT) :][:limit]])


def throughput(model, clock: SimulatedClock, truth: list[int], drafter, policy: str = "auto",
               hide_warm_up: bool = False) -> float:
    """Tokens a simulated second of verify passes, decoding PROMPT after the engine's calibration."""
    verifier = SlowVerifier(model, clock, hide_warm_up)
    engine = Engine(verifier, {"d": drafter}, ToyTokenizer(), (), 256, k=K, max_batch=1, policy=policy)
    spent = verifier.rows.spent
    [done] = engine.run([(PROMPT, SamplingParams(max_tokens=TOKENS))])
    assert done.token_ids == truth
    return len(done.token_ids) / (verifier.rows.spent - spent)


@pytest.mark.parametrize("hide_warm_up, keeps_up", [(False, True), (True, False)])
def test_the_default_policy_keeps_up_with_fixed_drafts_where_copies_are_right(tiny_model, clock, truth, hide_warm_up,
                                                                             keeps_up):
    """Negative control: a target that hides its warm-up has its slow first passes priced as the draft
    widths' costs, and the policy then stops drafting (what it did on CUDA)."""
    fixed = throughput(tiny_model, clock, truth, NgramDrafter(k=K), "fixed", hide_warm_up)
    auto = throughput(tiny_model, clock, truth, NgramDrafter(k=K), "auto", hide_warm_up)
    assert (auto >= 0.9 * fixed) == keeps_up, (auto, fixed)


def test_the_default_policy_stays_with_plain_decoding_where_nothing_can_be_copied(tiny_model, clock, truth):
    plain = throughput(tiny_model, clock, truth, NoDrafter())
    auto = throughput(tiny_model, clock, truth, wrong_copies(truth))
    assert auto >= 0.95 * plain, (auto, plain)


def test_calibration_warms_every_width_and_times_steady_passes_only(tiny_model, clock):
    verifier = SlowVerifier(tiny_model, clock)
    engine = Engine(verifier, {"ngram": NgramDrafter(k=K)}, ToyTokenizer(), (), 256, k=K, max_batch=1)
    assert all(verifier.rows.calls[(1, width)] > WARM_CALLS for width in range(1, K + 2))  # none left to warm up
    timed = engine.policy.costs.verify
    assert timed and all(cell.seconds == pytest.approx(steady_seconds(width)) for (_, width), cell in timed.items())


def test_the_policy_ignores_a_pass_that_was_not_steady():
    policy = DraftPolicy(K)
    policy.record(StepReport(verify=VerifyTiming((0,), 1.0)))
    policy.record(StepReport(verify=VerifyTiming((K,), 9.0, steady=False)))
    assert list(policy.costs.verify) == [(1, 1)]


def test_static_passes_are_steady_once_their_graph_replays(tiny_model):
    """On CUDA a static shape runs eagerly twice, is captured on its third pass and replayed after:
    only the replays are steady. Without graphs every pass is."""
    rows = RowModel(tiny_model, static=StaticShapes(max_rows=2, max_context=64, kv_block=16))
    rows.add("r", active=True)
    rows.prefill("r", [1, 2, 3])
    steady = [rows.forward_pass(rows.active_window, np.array([[4, 5]])).steady for _ in range(5)]
    assert steady == ([False] * 3 + [True] * 2 if TEST_DEVICE.type == "cuda" else [True] * 5)
