"""One decode step over the running rows: a run of stages over one `Step` value,

    limits -> free drafts -> plans -> lengths (the policy's choice) -> costly drafts -> the step's drafts -> verify

Each stage takes what it needs and returns what happened, failures included (`Drafted`, `Verify`);
`Stages.run` gathers them in the `Step`. No stage ends a request, emits a token or tells the policy
anything: the engine's loop applies a step after it runs (emits, failures, retirements) and reports
it to the policy once (`Step.report`). A drafter's fault fails its own requests only: a drafter
that raises, breaks its contract (`specdraft.drafters.base`) or proposes a draft the target cannot
check; so does a grammar that fails (`constrain`)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter, Parts
from specdraft.engine import constrain
from specdraft.engine.requests import Request
from specdraft.policy import CallTiming, DraftingTiming, DraftPolicy, RowPlan, StepReport, Verified, VerifyTiming
from specdraft.verifier import StepResult, TokenLogprob, Verifier


@dataclass
class Drafted:
    """What a drafting stage produced. `sources`: the policy's source of each row's draft (the free
    stage names the costly part's for the rows it leaves to it, `waiting`); `forced_from`: where the
    tokens the grammar forced start in a constrained row's draft; `unverified`: free drafts the step
    left out (the policy checks them against what the row emits)."""

    drafts: dict[str, Draft] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, list[Request]] = field(default_factory=dict)  # by drafter
    forced_from: dict[str, int] = field(default_factory=dict)
    unverified: dict[str, Draft] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    grammar_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    seconds: float = 0.0
    asked: dict[str, bool] = field(default_factory=dict)  # measured drafters the policy was asked about: called?
    calls: list[CallTiming] = field(default_factory=list)
    drafting: list[DraftingTiming] = field(default_factory=list)


@dataclass(frozen=True)
class Verify:
    """What the verify pass did: each row's result, the rows whose grammar failed in it, and whether
    the pass ran at its shape's steady cost (not a warm-up or capture of its shape)."""

    results: dict[str, StepResult]
    failed: dict[str, str]
    seconds: float
    steady: bool = True


@dataclass(frozen=True)
class Outcome:
    """What a verified row gets from the step: its tokens (the first `accepted` from its draft of
    `drafted`), its share of the step's drafting time, its grammar's time and forced tokens, and the
    tokens' logprobs where the request asked for them."""

    request: Request
    tokens: list[int]
    accepted: int
    drafted: int
    draft_seconds: float
    grammar_seconds: float
    forced: tuple[int, int]  # forced tokens verified after an accepted draft, and accepted
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass
class Step:
    """One decode step as the stages fill it in: the running rows (in the verifier's order) and the
    longest draft each may verify, the free drafts at full length (`proposed`) and the costly ones
    (`drafted`), the policy's plans and lengths, the drafts verified, the results, the rows that
    fail and why, and the step's timings."""

    rows: list[Request]
    limits: dict[str, int]
    started: float = field(default_factory=lambda: time.perf_counter())  # read through `time`: a test may simulate it
    proposed: Drafted = field(default_factory=Drafted)
    plans: list[RowPlan] = field(default_factory=list)
    lengths: dict[str, int] = field(default_factory=dict)
    drafted: Drafted = field(default_factory=Drafted)
    chosen: Drafted = field(default_factory=Drafted)
    verified: Verify | None = None
    drafting_rows: int = 0  # rows that shared the drafting time

    @property
    def failed(self) -> dict[str, str]:
        """Rows that end in this step, and why."""
        return {**self.proposed.failed, **self.drafted.failed, **self.chosen.failed,
                **(self.verified.failed if self.verified else {})}

    @property
    def live(self) -> list[Request]:
        failed = self.failed
        return [r for r in self.rows if r.id not in failed]

    @property
    def draft_seconds(self) -> float:
        return self.proposed.seconds + self.drafted.seconds

    def outcomes(self) -> Iterator[Outcome]:
        """The verified rows that did not fail, in order."""
        if self.verified is None:
            return
        share = self.draft_seconds / self.drafting_rows
        forced_from = {**self.proposed.forced_from, **self.chosen.forced_from}
        for request in self.live:
            result, drafted = self.verified.results[request.id], len(self.chosen.drafts.get(request.id, EMPTY_DRAFT))
            grammar = self.proposed.grammar_seconds[request.id] + self.chosen.grammar_seconds[request.id]
            yield Outcome(request, result.tokens, result.accepted, drafted, share, grammar + result.grammar_seconds,
                          constrain.forced_tally(forced_from.get(request.id), drafted, result.accepted),
                          result.logprobs)

    def report(self, now: float) -> StepReport:
        """The step as the policy learns from it; `now`: when the loop finished applying it."""
        if self.verified is None:  # every row failed before the pass
            return StepReport(tuple(self.plans), asked=self.proposed.asked, calls=tuple(self.proposed.calls),
                              drafting=tuple(self.drafted.drafting))
        results = self.verified.results
        order = [r.id for r in self.rows if r.id in results]
        lengths = [len(self.chosen.drafts.get(r, EMPTY_DRAFT)) for r in order]
        rows = tuple(Verified(r, self.proposed.sources[r], n, results[r].accepted, tuple(results[r].tokens),
                              tuple(self.chosen.unverified.get(r, EMPTY_DRAFT).token_ids.tolist()))
                     for r, n in zip(order, lengths))
        verify = VerifyTiming(tuple(lengths), self.verified.seconds, self.verified.steady)
        other = now - self.started - self.verified.seconds - self.draft_seconds
        return StepReport(tuple(self.plans), rows, verify, self.proposed.asked, tuple(self.proposed.calls),
                          tuple(self.drafted.drafting), other)


class Stages:
    """The stages of a decode step over the engine's verifier and drafters (by name, with their
    declared parts). The policy a step is given is asked (`worth_calling`, `choose`), never told."""

    def __init__(self, verifier: Verifier, drafters: Mapping[str, Drafter], parts: Mapping[str, Parts],
                 max_context: int) -> None:
        self.verifier, self.drafters, self.parts, self.max_context = verifier, drafters, parts, max_context

    def run(self, rows: list[Request], policy: DraftPolicy) -> Step:
        # The step adds one token of the target's own: a row drafts at most its room less one.
        step = Step(rows, {r.id: max(0, min(r.k, r.room(self.max_context) - 1)) for r in rows})
        step.proposed = self.free_drafts(step.live, step.limits, policy)
        step.plans = self.plans(step.live, step.limits, step.proposed)
        step.lengths = policy.choose(step.plans)
        step.drafted = self.costly_drafts(step.proposed.waiting, step.lengths, step.proposed.sources)
        step.chosen = self.chosen_drafts(step.live, step.proposed, step.drafted, step.lengths)
        step.drafting_rows = len(step.live)
        if step.live:
            step.verified = self.verify(step.live, step.chosen.drafts)
        return step

    # -- the stages ----------------------------------------------------------------------------------
    def free_drafts(self, rows: list[Request], limits: dict[str, int], policy: DraftPolicy) -> Drafted:
        """Each drafter's free or measured part drafts its rows at full length, so that the policy sees
        what they have (a measured part only where its call pays, see `DraftPolicy.worth_calling`);
        rows it leaves without a draft go to the drafter's costly part, if it has one."""
        out = Drafted()
        for name, group in _groups(rows).items():
            parts = self.parts[name]
            drafted: dict[str, Draft] = {}
            if parts.free is not None and _call_free(name, parts, group, limits, len(rows), policy, out.asked):
                wanted = [limits[r.id] for r in group]
                seconds, drafts, failed = _call(name, group, lambda: parts.free.propose([r.id for r in group], wanted))
                if not failed:
                    drafted, failed = _by_row(name, group, drafts, wanted)
                out.seconds += seconds
                out.failed.update(failed)
                if parts.free_cost == "measured" and not failed:
                    out.calls.append(CallTiming(name, {r.id: len(drafted[r.id]) for r in group}, seconds))
            for request in group:
                if request.id in out.failed:
                    continue
                draft = drafted.get(request.id, EMPTY_DRAFT)
                if request.grammar is not None:
                    draft = self._legal(request, draft, limits[request.id], out)
                    if draft is None:
                        continue
                if len(draft) or parts.costly is None:
                    out.drafts[request.id] = draft
                    out.sources[request.id] = parts.source(name, draft)
                else:
                    out.waiting.setdefault(name, []).append(request)
                    out.sources[request.id] = parts.source(name)
        return out

    def plans(self, rows: list[Request], limits: dict[str, int], proposed: Drafted) -> list[RowPlan]:
        """The rows as the policy sees them: what a free draft has, or what a costly part may draft."""
        plans = []
        for request in rows:
            cheap = request.id in proposed.drafts
            avail = len(proposed.drafts[request.id]) if cheap else limits[request.id]
            backlog = 0 if cheap else self.parts[request.drafter].costly.backlog(request.id)
            plans.append(RowPlan(request.id, proposed.sources[request.id], limits[request.id], cheap, avail, backlog,
                                 request.room(self.max_context), request.policy == "fixed"))
        return plans

    def costly_drafts(self, waiting: dict[str, list[Request]], lengths: dict[str, int],
                      sources: dict[str, str]) -> Drafted:
        """Each costly part drafts its rows at the lengths the policy chose (where any is above 0)."""
        out = Drafted()
        for name, group in waiting.items():
            wanted = [lengths[r.id] for r in group]
            if max(wanted, default=0) == 0:
                continue
            part = self.parts[name].costly
            seconds, result, failed = _call(name, group, lambda: part.propose_costly([r.id for r in group], wanted))
            out.seconds += seconds
            if not failed:
                drafted, failed = _by_row(name, group, result.drafts, wanted)
                out.drafts.update(drafted)
            out.failed.update(failed)
            if not failed:
                out.drafting.append(DraftingTiming(sources[group[0].id], max(wanted), seconds, result.pass_seconds,
                                                   result.catch_up.tokens, result.catch_up.seconds))
        return out

    def chosen_drafts(self, rows: list[Request], proposed: Drafted, drafted: Drafted,
                      lengths: dict[str, int]) -> Drafted:
        """The drafts this step verifies: the costly parts' (a constrained row's made legal, as free
        drafts were when drafted), and free drafts cut to their chosen lengths (a free draft the step
        leaves out is still checked, for free, against what the row emits: `unverified`)."""
        out = Drafted()
        for request in rows:
            draft = drafted.drafts.get(request.id)
            if draft is not None and request.grammar is not None:
                draft = self._legal(request, draft, lengths[request.id], out)
                if draft is None:
                    continue
            if draft is None:
                free = proposed.drafts.get(request.id)
                if free is None:
                    continue
                draft = free.prefix(lengths.get(request.id, 0))
                if len(free) and not len(draft):
                    out.unverified[request.id] = free
            if self._checked(request, draft, out):
                out.drafts[request.id] = draft
        return out

    def _legal(self, request: Request, draft: Draft, limit: int, out: Drafted) -> Draft | None:
        """A constrained row's draft made legal (`constrain.legal`), its time and forced tokens noted in
        `out`; None where the draft cannot be checked or the grammar failed (the row fails)."""
        if not self._checked(request, draft, out):  # the grammar takes vocabulary ids only
            return None
        legal = constrain.legal(request.grammar, draft, limit, self.parts[request.drafter].forced_tokens)
        out.grammar_seconds[request.id] += legal.seconds
        if legal.error is not None:
            out.failed[request.id] = legal.error
            return None
        if legal.forced_from is not None:
            out.forced_from[request.id] = legal.forced_from
        return legal.draft

    def _checked(self, request: Request, draft: Draft, out: Drafted) -> bool:
        """Whether the target can check the draft; where it cannot, the row fails (noted in `out`)."""
        problem = draft.problem(self.verifier.vocab_size)
        if problem is not None:
            out.failed[request.id] = f"drafter {request.drafter!r} proposed a draft the target cannot check: {problem}"
        return problem is None

    def verify(self, rows: list[Request], drafts: dict[str, Draft]) -> Verify:
        """One verify pass over the rows (the other running rows sit it out)."""
        started = time.perf_counter()
        results = self.verifier.step({r.id: r.last_token for r in rows},
                                     {r.id: drafts[r.id] for r in rows if len(drafts.get(r.id, EMPTY_DRAFT))})
        seconds = time.perf_counter() - started
        return Verify(results, {r: result.error for r, result in results.items() if result.error is not None}, seconds,
                      all(result.steady for result in results.values()))


def _call_free(name: str, parts: Parts, group: list[Request], limits: dict[str, int], batch: int, policy: DraftPolicy,
               asked: dict[str, bool]) -> bool:
    """Whether this step calls a drafter's free part: always a free one, or one with a row on the
    `fixed` policy; a measured one where a row may draft and the policy says its call pays."""
    if parts.free_cost == "free" or any(r.policy == "fixed" for r in group):
        return True
    wanted = [limits[r.id] for r in group]
    if not any(wanted):
        return False
    asked[name] = policy.worth_calling(name, [r.id for r in group], wanted, batch)
    return asked[name]


def _groups(rows: list[Request]) -> dict[str, list[Request]]:
    groups: dict[str, list[Request]] = {}
    for request in rows:
        groups.setdefault(request.drafter, []).append(request)
    return groups


def _call(name: str, group: list[Request], call: Callable[[], Any]) -> tuple[float, Any, dict[str, str]]:
    """A drafter's batched call, timed: (seconds, its result, no failures), or, where the drafter
    raises, (seconds, None, its requests' failures)."""
    start = time.perf_counter()
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its requests
        return time.perf_counter() - start, None, _all(group, f"drafter {name!r} failed: {type(exc).__name__}: {exc}")
    return time.perf_counter() - start, result, {}


def _by_row(name: str, group: list[Request], drafts: Any, limits: list[int]) -> tuple[dict[str, Draft], dict[str, str]]:
    """A call's drafts by row, after checking that it kept the contract (one draft per request, none
    longer than asked); where it did not, its requests' failures."""
    if not isinstance(drafts, list) or len(drafts) != len(group) or not all(isinstance(d, Draft) for d in drafts):
        count = len(drafts) if isinstance(drafts, list) else type(drafts).__name__
        return {}, _all(group, f"drafter {name!r} broke its contract: propose must return a list of {len(group)} "
                               f"Drafts, got {count}")
    for draft, limit in zip(drafts, limits):
        if len(draft) > limit:
            return {}, _all(group, f"drafter {name!r} broke its contract: a draft of {len(draft)} tokens where at "
                                   f"most {limit} were asked for")
    return {r.id: d for r, d in zip(group, drafts)}, {}


def _all(group: list[Request], error: str) -> dict[str, str]:
    return {r.id: error for r in group}
