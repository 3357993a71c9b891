"""The cost-aware draft length: it drafts when the measured costs and the estimated acceptance say a
draft pays, stops when they say it does not, learns from verified and from shadow drafts, and in an
engine stops verifying drafts that keep failing while output stays exact."""

from __future__ import annotations

import numpy as np
import pytest

from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.policy import EXPLORE_EVERY, CostModel, DraftPolicy, RowPlan, StepReport, Verified
from specdraft.policy.costs import least_squares
from specdraft.policy.report import CallTiming, DraftingTiming
from specdraft.verifier import Verifier
from tests.helpers.tiny import TINY_VOCAB, ScriptedDrafter, ToyTokenizer, hf_greedy


class FixedCosts(CostModel):
    """Costs set by the test: the engine's own timings (noisy on a shared machine) are ignored."""

    def observe_verify(self, batch, width, seconds):
        pass

    def observe_draft(self, drafter, tokens, seconds):
        pass

    def observe_other(self, seconds):
        pass


def policy_with_costs(verify: dict[tuple[int, int], float], max_k: int = 5) -> DraftPolicy:
    policy = DraftPolicy(max_k)
    for (batch, width), seconds in verify.items():
        policy.costs.observe_verify(batch, width, seconds)
    return policy


def observe(policy: DraftPolicy, request_id: str, drafted: int, accepted: int, source: str = "ngram") -> None:
    """A step verified a draft of `drafted` tokens from `source`, the first `accepted` of them accepted."""
    policy.record(StepReport(rows=(Verified(request_id, source, drafted, accepted),)))


def step(policy: DraftPolicy, rows: list[RowPlan]) -> dict[str, int]:
    """A step as the engine runs one: the policy chooses, then hears what it planned."""
    lengths = policy.choose(rows)
    policy.record(StepReport(plans=tuple(rows)))
    return lengths


def plans(policy: DraftPolicy, count: int, avail: int = 5, drafter: str = "ngram", cheap: bool = True) -> list[RowPlan]:
    out = []
    for i in range(count):
        policy.begin(f"r{i}", drafter)
        out.append(RowPlan(f"r{i}", drafter, avail, cheap, avail))
    return out


def test_free_verification_drafts_everything():
    policy = policy_with_costs({(1, w): 0.010 for w in range(1, 7)})
    assert policy.choose(plans(policy, 1)) == {"r0": 5}


def test_expensive_verification_drafts_nothing():
    policy = policy_with_costs({(1, w): 0.010 * w for w in range(1, 7)})  # each draft token costs a whole step
    assert policy.choose(plans(policy, 1)) == {"r0": 0}


def test_noisy_cheaper_wide_pass_does_not_buy_useless_drafts():
    policy = policy_with_costs({(1, 1): 0.010, (1, 2): 0.009, (1, 3): 0.012})
    [plan] = plans(policy, 1, avail=2)
    for _ in range(40):
        observe(policy, "r0", 2, 0)  # every draft fails at once
    assert policy.choose([plan]) == {"r0": 0}


@pytest.mark.parametrize("accepted, expected", [(5, 5), (0, 0)])
def test_acceptance_evidence_moves_the_choice(accepted, expected):
    policy = policy_with_costs({(1, w): 0.010 * (1 + 0.3 * (w - 1)) for w in range(1, 7)})
    [plan] = plans(policy, 1)
    for _ in range(30):
        observe(policy, "r0", 5, accepted)
    assert policy.choose([plan]) == {"r0": expected}


def test_batch_size_changes_the_answer():
    """The same acceptance pays at batch 1 (verifying a draft token costs little there) but not at
    batch 16 (a wider pass costs nearly its width there), as measured on this project's CPU. Costs
    are keyed by (rows, tokens computed): a padded pass of width 2 over 16 rows computes 32."""
    costs = {(1, 1): 0.041, (1, 2): 0.045, (16, 16): 0.108, (16, 32): 0.190}
    policy = policy_with_costs(costs, max_k=1)
    for batch, expected in ((1, 1), (16, 0)):
        rows = plans(policy, batch, avail=1)
        for row in rows:
            for accepted in [1, 0] * 10:  # half the drafts accepted
                observe(policy, row.request_id, 1, accepted)
        assert set(policy.choose(rows).values()) == {expected}


def test_costly_drafters_pay_for_their_draft_tokens():
    policy = policy_with_costs({(1, w): 0.010 for w in range(1, 7)})
    rows = plans(policy, 1, drafter="model", cheap=False)
    for _ in range(10):
        observe(policy, "r0", 5, 3, "model")
    assert policy.choose(rows)["r0"] > 0
    policy.costs.observe_draft("model", 1, 0.050)  # a draft token costs five verify steps
    assert policy.choose(rows) == {"r0": 0}


def test_shadow_drafts_teach_the_estimate_for_free():
    policy = DraftPolicy(5)
    policy.begin("r", "ngram")
    before = policy.alpha("r")[0]
    for _ in range(10):  # steps that verify no draft: [7, 8] was proposed and left out
        policy.record(StepReport(rows=(Verified("r", "ngram", 0, 0, (7,), unverified=(7, 8)),)))  # matched the first token
        policy.record(StepReport(rows=(Verified("r", "ngram", 0, 0, (8, 9)),)))  # matched the second: fully accepted
    assert policy.alpha("r")[0] > before + 0.2
    for _ in range(20):
        policy.record(StepReport(rows=(Verified("r", "ngram", 0, 0, (1,), unverified=(7, 8)),)))  # the first is wrong
    assert policy.alpha("r")[0] < 0.2


def test_engine_stops_verifying_drafts_that_always_fail(tiny_model):
    prompt = [5, 17, 42, 9, 9, 13]
    truth = hf_greedy(tiny_model, prompt, 60)
    wrong = ScriptedDrafter(lambda context, limit: [(context[-1] + 1) % TINY_VOCAB] * limit)
    engine = Engine(Verifier(tiny_model), {"wrong": wrong}, ToyTokenizer(), (), 256, k=4, max_batch=1, calibrate=False)
    engine.policy.costs = FixedCosts()
    for width, ratio in enumerate([1.0, 1.11, 1.19, 1.17, 1.56], start=1):  # the embedded model's, measured here
        CostModel.observe_verify(engine.policy.costs, 1, width, 0.041 * ratio)
    [done] = engine.run([(prompt, SamplingParams(max_tokens=60))])
    assert done.token_ids == truth
    verified = done.metrics.draft_tokens
    assert verified < 0.1 * 4 * done.metrics.steps  # drafting everything would verify 4 a step


def test_engine_drafts_long_when_drafts_are_right(tiny_model):
    prompt = [5, 17, 42, 9, 9, 13]
    truth = hf_greedy(tiny_model, prompt, 60)

    def oracle(context, limit):
        done = len(context) - len(prompt)
        return truth[done : done + limit]

    engine = Engine(Verifier(tiny_model), {"oracle": ScriptedDrafter(oracle)}, ToyTokenizer(), (), 256, k=4, max_batch=1,
                    calibrate=False)
    engine.policy.costs = FixedCosts()
    for width in range(1, 6):  # a tiny model's pass costs about the same at any width
        CostModel.observe_verify(engine.policy.costs, 1, width, 0.002)
    [done] = engine.run([(prompt, SamplingParams(max_tokens=60))])
    assert done.token_ids == truth
    assert done.metrics.mean_accepted_length > 2.5
    assert done.metrics.accepted_per_step[-4:-1] == [4, 4, 4]  # full drafts (the last step meets the budget)


def test_acceptance_is_learned_per_kind_of_draft():
    """One request whose long-match copies are right and whose short-match copies are wrong: the
    policy verifies the first kind and not the second (pooled over kinds it would do one or the other)."""
    policy = policy_with_costs({(1, w): 0.010 * (1 + 0.3 * (w - 1)) for w in range(1, 7)})
    policy.begin("r", "ngram")
    for _ in range(30):
        observe(policy, "r", 5, 5, "ngram:copy4")
        observe(policy, "r", 5, 0, "ngram:copy1")
    assert policy.choose([RowPlan("r", "ngram:copy4", 5, True, 5)]) == {"r": 5}
    assert policy.choose([RowPlan("r", "ngram:copy1", 5, True, 5)]) == {"r": 0}


def batch_of_strong_and_weak(policy: DraftPolicy, strong: int, weak: int) -> list[RowPlan]:
    rows = plans(policy, strong + weak)
    for i, row in enumerate(rows):
        for _ in range(30):
            observe(policy, row.request_id, 5, 5 if i < strong else 0)
    return rows


def test_packed_rows_draft_apart_where_padded_rows_cannot():
    """16 rows, 2 of whose drafts are always right. Padded, any draft makes all 16 rows pay its width,
    and the policy drafts nothing; packed (a pass costs its real tokens), the two strong rows draft
    their whole proposals and the 14 weak ones none. Costs: a pass over 16 rows costs 108 ms plus
    2.6 ms a token beyond 16 (this project's CPU, embedded model)."""
    def cost(tokens):
        return 0.108 + 0.0026 * (tokens - 16)

    padded = DraftPolicy(5, packed=False)
    for width in range(1, 7):
        padded.costs.observe_verify(16, 16 * width, cost(16 * width))
    assert set(padded.choose(batch_of_strong_and_weak(padded, 2, 14)).values()) == {0}
    packed = DraftPolicy(5, packed=True)
    for tokens in (16, 21, 26, 96):
        packed.costs.observe_verify(16, tokens, cost(tokens))
    chosen = packed.choose(batch_of_strong_and_weak(packed, 2, 14))
    assert chosen == {f"r{i}": 5 if i < 2 else 0 for i in range(16)}


def test_packed_choice_stops_where_a_token_costs_more_than_it_brings():
    """One row whose acceptance halves at each position: packed, it drafts the positions whose
    expected gain beats what a computed token costs, and no more."""
    policy = DraftPolicy(5, packed=True)
    for tokens in range(1, 7):
        policy.costs.observe_verify(1, tokens, 0.010 * (1 + 0.4 * (tokens - 1)))
    [row] = plans(policy, 1)
    for _ in range(60):
        for accepted in (0, 1, 1, 2, 2, 2, 2, 5):  # alpha about 0.9 at the first position, then falling
            observe(policy, "r0", 5, accepted)
    n = policy.choose([row])["r0"]
    rates = [(1 + policy.expected_accepted("r0", m)) / (0.010 * (1 + 0.4 * m)) for m in range(6)]
    assert n == max(range(6), key=rates.__getitem__) and 0 < n < 5


def test_a_costly_rows_strong_guess_does_not_stop_free_rows_from_drafting():
    """Packed: 4 rows with free drafts accepted 70% of the time, and 1 row the model would draft for,
    believed right 95% of the time but costing a whole verify pass a token. The best step drafts the
    free rows' proposals and leaves the model out. (Taking prefixes of all positions by gain, the
    model row's first positions come before the free rows' weaker ones, and every prefix past them
    pays the model.)"""
    policy = DraftPolicy(5, packed=True)
    for tokens in range(5, 31):
        policy.costs.observe_verify(5, tokens, 0.100 + 0.002 * (tokens - 5))
    policy.costs.observe_draft("model", 1, 0.100)
    rows = plans(policy, 4)
    for row in rows:
        for _ in range(40):
            for accepted in (5, 5, 0):  # alpha ~ 0.7 at the first position
                observe(policy, row.request_id, 5, accepted)
    policy.begin("m", "model")
    for _ in range(40):
        observe(policy, "m", 5, 5, "model")
    chosen = policy.choose([*rows, RowPlan("m", "model", 5, False, 5)])
    assert chosen["m"] == 0 and all(chosen[r.request_id] == 5 for r in rows)


def test_a_costly_drafter_pays_for_what_it_must_catch_up_on():
    """A model draft that pays when the model is in step with the row does not when it must first
    catch up on 300 tokens of context it sat out for a few tokens more; for a long generation ahead
    (which the caught-up model goes on drafting for) the catch-up pays."""
    policy = policy_with_costs({(1, w): 0.100 + 0.005 * (w - 1) for w in range(1, 7)})
    policy.costs.observe_draft("model", 1, 0.010)
    policy.costs.observe_catch_up("model", 256, 0.512)  # 2 ms a token
    [row] = plans(policy, 1, drafter="model", cheap=False)
    for _ in range(20):
        observe(policy, "r0", 5, 5, "model")
    assert policy.choose([row]) == {"r0": 5}
    assert policy.choose([RowPlan("r0", "model", 5, False, 5, backlog=300, remaining=5)]) == {"r0": 0}
    assert policy.choose([RowPlan("r0", "model", 5, False, 5, backlog=300, remaining=2000)]) == {"r0": 5}


def test_a_drafting_calls_catch_up_is_never_priced_as_drafting():
    """A call that only caught up (its row still too far behind to draft: no position drafted) teaches
    the catch-up's cost and not the drafting's; a call that caught up and then drafted, with no pass of
    its own timed, is priced as drafting less what it spent catching up. Before, a prompt's catch-up
    over the 5 positions asked priced a drafted token at 0.18 s, and the policy never drafted again."""
    policy = DraftPolicy(5)
    policy.costs.observe_draft("model", 1, 0.010)
    policy.record(StepReport(drafting=(DraftingTiming("model", 0, 0.900, None, 256, 0.900),)))
    assert policy.costs.draft_seconds("model", 1) == pytest.approx(0.010)
    assert policy.costs.catch_up_seconds("model", 1) == pytest.approx(0.900 / 256)
    for _ in range(7):  # the window of timings: the new ones only
        policy.record(StepReport(drafting=(DraftingTiming("model", 5, 0.350, None, 100, 0.300),)))
    assert policy.costs.draft_seconds("model", 1) == pytest.approx(0.010)


def test_a_catch_up_is_spread_only_over_the_steps_the_costly_drafter_serves():
    """`hybrid` asks its model only where its n-gram part has no draft. A request whose steps nearly
    all had an n-gram draft would use a caught-up model for few of its remaining tokens: the same
    catch-up that pays for a `model` request (which drafts with the model every step) does not."""
    policy = policy_with_costs({(1, w): 0.100 + 0.005 * (w - 1) for w in range(1, 7)})
    for source in ("model", "hybrid/model"):
        policy.costs.observe_draft(source, 1, 0.010)
        policy.costs.observe_catch_up(source, 256, 0.512)  # 2 ms a token
    policy.begin("m", "model")
    policy.begin("h", "hybrid")
    for _ in range(20):
        observe(policy, "m", 5, 5, "model")
        observe(policy, "h", 5, 5, "hybrid/model")
    for _ in range(100):  # the hybrid request's n-gram part had a draft (none to verify here)
        step(policy, [RowPlan("h", "hybrid:copy4", 5, True, 0)])
    assert policy.choose([RowPlan("m", "model", 5, False, 5, backlog=600, remaining=200)]) == {"m": 5}
    assert policy.choose([RowPlan("h", "hybrid/model", 5, False, 5, backlog=600, remaining=200)]) == {"h": 0}


def test_a_fixed_row_drafts_all_it_has_while_the_others_are_chosen_around_it():
    policy = DraftPolicy(5, packed=True)
    for tokens in range(2, 13):
        policy.costs.observe_verify(2, tokens, 0.010 * tokens)  # each draft token costs a whole row's step
    policy.begin("f", "ngram")
    policy.begin("a", "ngram")
    chosen = policy.choose([RowPlan("f", "ngram", 5, True, 4, fixed=True), RowPlan("a", "ngram", 5, True, 5)])
    assert chosen == {"f": 4, "a": 0}
    padded = DraftPolicy(5, packed=False)
    for width in range(1, 7):
        padded.costs.observe_verify(2, 2 * width, 0.010 * width)
    padded.begin("f", "ngram")
    padded.begin("a", "ngram")
    chosen = padded.choose([RowPlan("f", "ngram", 5, True, 3, fixed=True), RowPlan("a", "ngram", 5, True, 5)])
    assert chosen["f"] == 3 and chosen["a"] in (3, 4, 5)  # padded: the width is at least the fixed row's


def test_exploring_never_pays_a_catch_up_once_the_drafter_was_measured():
    """Every EXPLORE_EVERY choices the policy tries a close runner-up to measure its cost afresh; a
    candidate that would catch a costly drafter up on a prompt is an investment, not explored once
    a draft of that drafter was verified. Before that its estimate is only the prior, and the
    catch-up is explored: once, as the first verified draft gives the drafter its evidence."""
    policy = policy_with_costs({(1, w): 0.100 + 0.005 * (w - 1) for w in range(1, 7)})
    policy.costs.observe_draft("model", 1, 0.010)
    policy.costs.observe_catch_up("model", 256, 0.512)
    [row] = plans(policy, 1, drafter="model", cheap=False)
    row = RowPlan("r0", "model", 5, False, 5, backlog=300, remaining=15)  # close: ~0.89x plain
    chosen = [step(policy, [row])["r0"] for _ in range(EXPLORE_EVERY)]
    assert chosen[-1] > 0 and not any(chosen[:-1])  # never measured: explored at the first chance
    observe(policy, "r0", chosen[-1], 0, "model")  # the explored draft was rejected
    assert all(step(policy, [row]) == {"r0": 0} for _ in range(3 * EXPLORE_EVERY))
    # Without a catch-up, a close runner-up (one draft token at 0.86x plain's rate) is explored now and then.
    policy = policy_with_costs({(1, w): 0.100 + 0.005 * (w - 1) for w in range(1, 7)})
    policy.costs.observe_draft("model", 1, 0.080)
    plans(policy, 1, drafter="model", cheap=False)
    caught_up = RowPlan("r0", "model", 5, False, 5, backlog=0, remaining=10)
    chosen = [step(policy, [caught_up])["r0"] for _ in range(3 * EXPLORE_EVERY)]
    assert 0 < sum(n > 0 for n in chosen) <= 3


def test_positions_no_draft_has_reached_are_priced_as_the_last_one_measured():
    """A kind accepted in full at positions 1..5 (all that drafts of 5 reached) is drafted far
    beyond them when longer drafts are allowed and a token of verification is cheap beside a step;
    a kind that fails at position 5 is not."""
    policy = policy_with_costs({(1, w): 0.030 + 0.002 * (w - 1) for w in (1, 2, 6, 17)}, max_k=16)
    for request_id, hits in (("sure", 5), ("unsure", 4)):
        policy.begin(request_id, "ngram")
        for _ in range(20):
            observe(policy, request_id, 5, hits, f"ngram:{request_id}")
    assert policy.choose([RowPlan("sure", "ngram:sure", 16, True, 16)]) == {"sure": 16}
    assert policy.choose([RowPlan("unsure", "ngram:unsure", 16, True, 16)])["unsure"] <= 5


def test_an_unseen_pass_between_two_measured_ones_is_priced_between_them():
    """A compiled CPU step that takes passes of up to 8 tokens: a 9-token pass runs eagerly, at twice
    the cost. A straight fit through all cells would price a 6-token pass near the eager ones."""
    costs = CostModel()
    for tokens, seconds in ((1, 0.030), (8, 0.040), (9, 0.070), (33, 0.130)):
        costs.observe_verify(1, tokens, seconds)
    assert costs.verify_seconds(1, 5) == pytest.approx(0.030 + 0.010 * 4 / 7)
    assert costs.verify_seconds(1, 17) == pytest.approx(0.070 + 0.060 * 8 / 24)
    assert costs.verify_seconds(1, 40) > 0.130  # beyond the measured cells: the fit


def test_one_empty_proposal_does_not_stop_a_measured_drafter_but_a_run_of_them_does():
    """A copying drafter's first call after a prompt often has nothing to copy (the last token has not
    occurred before): that alone must not skip its calls until the next exploration, when the call
    costs more than the noise of a step; a drafter that keeps proposing nothing is skipped."""
    policy = policy_with_costs({(2, 2): 0.010, (2, 6): 0.010, (2, 10): 0.010})
    for request_id in ("a", "b"):
        policy.begin(request_id, "four")

    def called(proposed: int) -> None:
        policy.record(StepReport(asked={"four": True}, calls=(CallTiming("four", {"a": proposed, "b": proposed}, 0.002),)))

    called(0)
    assert policy.worth_calling("four", ["a", "b"], [4, 4], 2)
    for _ in range(20):
        called(0)
    assert not policy.worth_calling("four", ["a", "b"], [4, 4], 2)
    for _ in range(3):
        called(4)
    assert policy.worth_calling("four", ["a", "b"], [4, 4], 2)


@pytest.mark.parametrize("seed", range(6))
def test_a_costly_drafter_that_cannot_pay_is_not_priced_yet_chosen_as_if_it_were(seed):
    """Where every row with a choice waits for costly drafters whose pass for one position costs at
    least their rows' share of a plain step, `choose` returns plain decoding without pricing the
    candidates: the choice the pricing makes, step by step, over random costs, acceptance, batches,
    backlogs and steps that explore."""
    rng = np.random.default_rng(seed)
    for _ in range(20):
        batch = int(rng.integers(1, 4))
        verify = {(batch, batch + n): 0.010 + 0.002 * n * float(rng.random()) for n in range(0, 5 * batch + 1)}
        policies = [policy_with_costs(verify), policy_with_costs(verify)]
        policies[1]._costly_cannot_pay = lambda plans: False  # every candidate priced
        plain = verify[(batch, batch)]
        rows = []
        for i in range(batch):
            source = ("model", "hybrid/model")[int(rng.integers(2))]
            rows.append(RowPlan(f"r{i}", source, 5, False, 5, backlog=int(rng.integers(0, 50)), remaining=100))
        draft = {source: plain * float(rng.uniform(0.1, 3.0)) for source in ("model", "hybrid/model")}
        accepted = int(rng.integers(0, 6))
        for policy in policies:
            for source, seconds in draft.items():
                policy.costs.observe_draft(source, 1, seconds)
                policy.costs.observe_catch_up(source, 1, seconds / 4)
            for row in rows:
                policy.begin(row.request_id, "model" if row.source == "model" else "hybrid")
                for _ in range(10):
                    observe(policy, row.request_id, 5, accepted, row.source)
        for _ in range(EXPLORE_EVERY + 2):
            assert step(policies[0], rows) == step(policies[1], rows)


def test_a_costly_drafter_that_cannot_pay_still_has_its_cost_explored():
    policy = policy_with_costs({(1, w): 0.010 for w in range(1, 7)})  # drafting tokens is free to verify
    [row] = plans(policy, 1, drafter="model", cheap=False)
    for _ in range(10):
        observe(policy, "r0", 5, 5, "model")  # always accepted
    policy.costs.observe_draft("model", 1, 0.011)  # ... but a draft pass costs more than a plain step
    chosen = [step(policy, [row])["r0"] for _ in range(2 * EXPLORE_EVERY)]
    assert sum(n > 0 for n in chosen) == 2 and chosen[EXPLORE_EVERY - 1] > 0


def test_the_verify_cost_line_is_the_least_squares_one():
    """`costs.least_squares`, closed form where the cells share one batch size, is NumPy's
    minimum-norm least squares (the intercept split between the constant and the batch size)."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        tokens = rng.choice(np.arange(1, 64), int(rng.integers(2, 9)), replace=False)
        one_batch = trial % 2 == 0
        cells = {(int(rng.integers(1, 9)) if not one_batch else 3, int(n)): float(0.004 + 0.0003 * n + 0.002 * rng.random())
                 for n in tokens}
        cells = [(batch, n, seconds) for (batch, n), seconds in cells.items()]
        design = np.array([[1.0, batch, n] for batch, n, _ in cells])
        expected = np.linalg.lstsq(design, np.array([s for *_, s in cells]), rcond=None)[0]
        assert np.allclose(least_squares(cells), expected, rtol=1e-7, atol=1e-12)


def test_a_catch_up_is_priced_against_how_long_replies_run_not_the_limit():
    """A request without a limit may run to the whole context; where the replies seen so far ended after
    a few tokens, a catch-up that would pay over 2000 tokens does not pay over those few. Replies cut at
    their limit say nothing against it."""
    def after(replies: list[tuple[int, bool]]) -> int:
        policy = policy_with_costs({(1, w): 0.100 + 0.005 * (w - 1) for w in range(1, 7)})
        policy.costs.observe_draft("model", 1, 0.010)
        policy.costs.observe_catch_up("model", 256, 0.512)  # 2 ms a token
        for i, (length, ended) in enumerate(replies):
            policy.begin(f"done{i}", "model")
            policy.end(f"done{i}", length, ended)
        [_] = plans(policy, 1, drafter="model", cheap=False)
        for _ in range(20):
            observe(policy, "r0", 5, 5, "model")
        return policy.choose([RowPlan("r0", "model", 5, False, 5, backlog=300, remaining=2000)])["r0"]

    assert after([]) == 5
    assert after([(128, False)] * 8) == 5
    assert after([(6, True)] * 8) == 0
