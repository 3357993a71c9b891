"""One decode step over the running rows: a run of stages over one `Step` value,

    limits -> free drafts -> plans -> lengths (the policy's choice) -> costly drafts -> the step's drafts -> verify

A `Step` holds one record per running row (`Row`: its limit, its draft's source, its drafts, the
length chosen, its grammar's forced tokens and time, its failure, what it emitted), from the plan to
the engine's delta, and the step's timings. The verify stage hands the verifier the live rows as one
`Batch` in its order, and reads its `Verdict` back by the same index.
Each stage fills in the rows it is given; `Stages.run` runs them in order. No stage ends a request,
emits a token or tells the policy anything: the engine's loop applies a step after it runs (emits,
failures, retirements) and reports it to the policy once (`Step.report`). Each row's drafter is
the object on its request (resolved at intake), never looked up by name. A drafter's fault fails
its own requests only: a drafter that raises, breaks its contract (`specdraft.drafters.base`) or
proposes a draft the target cannot check (checked here, the one place: `_checked`); so does a
grammar that fails (`constrain`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specdraft.draft import EMPTY_DRAFT, Draft
from specdraft.drafters.base import Cost, Parts, drafter_failure
from specdraft.engine import constrain
from specdraft.engine.requests import Request
from specdraft.params import Policy
from specdraft.policy import CallTiming, DraftingTiming, DraftPolicy, RowPlan, StepReport, Verified, VerifyTiming
from specdraft.results import TokenLogprob
from specdraft.verifier import Batch, Verifier


@dataclass
class Row:
    """One running row through a step. limit: the longest draft it may verify; source: its draft's
    source, as the policy keeps estimates; free: its free part's draft at full length (None: it has
    none, and `waits` for its drafter's costly part); costly: the costly part's draft; length: the
    length the policy chose; chosen: the draft verified (None: none); unverified: a free draft the
    step left out (the policy checks it against what the row emits); forced_from: where the tokens
    its grammar forced start in its draft; failure: why the row ends in this step (None: it goes on);
    verified: it took part in the verify pass; tokens, accepted, logprobs: what it emitted there (its
    accepted draft, then the target's token) and those tokens' logprobs where it asked for them."""

    request: Request
    limit: int
    source: str = ""
    free: Draft | None = None
    costly: Draft | None = None
    length: int = 0
    chosen: Draft | None = None
    unverified: Draft | None = None
    forced_from: int | None = None
    grammar_seconds: float = 0.0
    failure: str | None = None
    verified: bool = False
    tokens: list[int] = field(default_factory=list)
    accepted: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def waits(self) -> bool:
        """Whether the row waits for its drafter's costly part (a live row has a free draft or waits)."""
        return self.free is None

    @property
    def drafted(self) -> int:
        """Tokens of draft the row verified."""
        return 0 if self.chosen is None else len(self.chosen)

    @property
    def forced(self) -> tuple[int, int]:
        """Tokens its grammar forced that it verified after an accepted draft, and of those accepted."""
        return constrain.forced_tally(self.forced_from, self.drafted, self.accepted)


@dataclass
class Step:
    """One decode step as the stages fill it in: its rows (in the verifier's order), the rows that
    failed (in the order they did), the policy's plans, and the step's timings: free and costly
    drafting, the verify pass (None: every row failed before it) and whether it ran at its shape's
    steady cost (not a warm-up or capture of its shape); `asked`: the measured drafters the policy
    was asked about, and whether it said to call them."""

    rows: list[Row]
    started: float = field(default_factory=lambda: time.perf_counter())  # read through `time`: a test may simulate it
    failed: list[Row] = field(default_factory=list)
    plans: list[RowPlan] = field(default_factory=list)
    free_seconds: float = 0.0
    costly_seconds: float = 0.0
    verify_seconds: float | None = None
    steady: bool = True
    drafting_rows: int = 0  # rows that shared the drafting time
    asked: dict[str, bool] = field(default_factory=dict)
    calls: list[CallTiming] = field(default_factory=list)
    drafting: list[DraftingTiming] = field(default_factory=list)

    @property
    def live(self) -> list[Row]:
        return [row for row in self.rows if row.failure is None]

    def fail(self, rows: list[Row], why: str) -> None:
        for row in rows:
            row.failure = why
            self.failed.append(row)

    @property
    def draft_seconds(self) -> float:
        return self.free_seconds + self.costly_seconds

    @property
    def tokens(self) -> int:
        """Tokens the verify pass took: each verified row's last token and its chosen draft (the step's
        share of the engine's token budget; prefill gets what is left)."""
        return sum(1 + row.drafted for row in self.rows if row.verified)

    @property
    def emitting(self) -> list[Row]:
        """The verified rows that did not fail, in order: each emits its tokens."""
        return [row for row in self.live if row.verified]

    @property
    def draft_share(self) -> float:
        """Each drafting row's share of the step's drafting time."""
        return self.draft_seconds / max(self.drafting_rows, 1)

    def report(self, now: float) -> StepReport:
        """The step as the policy learns from it; `now`: when the loop finished applying it."""
        if self.verify_seconds is None:
            return StepReport(tuple(self.plans), asked=self.asked, calls=tuple(self.calls), drafting=tuple(self.drafting))
        verified = [row for row in self.rows if row.verified]
        rows = tuple(Verified(row.id, row.source, row.drafted, row.accepted, tuple(row.tokens),
                              tuple((row.unverified or EMPTY_DRAFT).token_ids.tolist())) for row in verified)
        verify = VerifyTiming(tuple(row.drafted for row in verified), self.verify_seconds, self.steady)
        other = now - self.started - self.verify_seconds - self.draft_seconds
        return StepReport(tuple(self.plans), rows, verify, self.asked, tuple(self.calls), tuple(self.drafting), other)


class Stages:
    """The stages of a decode step over the engine's verifier; each row brings its drafter (and the
    drafter's declared parts) on its request. The policy a step is given is asked (`worth_calling`,
    `choose`), never told."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def run(self, requests: list[Request], policy: DraftPolicy) -> Step:
        # The step adds one token of the target's own: a row drafts at most its room less one.
        step = Step([Row(r, max(0, min(r.k, r.room - 1))) for r in requests])
        self.free_drafts(step, policy)
        step.plans = self.plans(step.live)
        lengths = policy.choose(step.plans)
        for row in step.live:
            row.length = lengths.get(row.id, 0)
        self.costly_drafts(step)
        self.chosen_drafts(step)
        step.drafting_rows = len(step.live)
        if step.live:
            self.verify(step)
        return step

    # -- the stages ----------------------------------------------------------------------------------
    def free_drafts(self, step: Step, policy: DraftPolicy) -> None:
        """Each drafter's free or measured part drafts its rows at full length, so that the policy sees
        what they have (a measured part only where its call pays, see `DraftPolicy.worth_calling`);
        rows it leaves without a draft go to the drafter's costly part, if it has one."""
        batch = len(step.rows)
        for name, group in _groups(step.rows).items():
            parts = group[0].request.parts
            drafts: list[Draft] | None = None
            if parts.free is not None and _call_free(name, parts, group, batch, policy, step.asked):
                wanted = [row.limit for row in group]
                seconds, drafts, why = _call(name, lambda: parts.free.propose([row.id for row in group], wanted))
                why = why or _broken(name, drafts, wanted)
                step.free_seconds += seconds
                if why is not None:
                    step.fail(group, why)
                    continue
                if parts.free_cost is Cost.MEASURED:
                    step.calls.append(CallTiming(name, {row.id: len(d) for row, d in zip(group, drafts)}, seconds))
            for b, row in enumerate(group):
                draft = EMPTY_DRAFT if drafts is None else drafts[b]
                if row.request.grammar is not None:
                    draft = self._legal(step, row, draft, row.limit)
                    if draft is None:
                        continue
                if len(draft) or parts.costly is None:
                    row.free, row.source = draft, parts.source(name, draft)
                else:
                    row.source = parts.source(name)

    def plans(self, rows: list[Row]) -> list[RowPlan]:
        """The rows as the policy sees them: what a free draft has, or what a costly part may draft."""
        return [RowPlan(row.id, row.source, row.limit, not row.waits, row.limit if row.waits else len(row.free),
                        row.request.parts.costly.backlog(row.id) if row.waits else 0,
                        row.request.room, row.request.policy is Policy.FIXED, len(row.request.generated))
                for row in rows]

    def costly_drafts(self, step: Step) -> None:
        """Each costly part drafts its rows at the lengths the policy chose (where any is above 0)."""
        for name, group in _groups(step.rows).items():
            group = [row for row in group if row.waits and row.failure is None]
            wanted = [row.length for row in group]
            if max(wanted, default=0) == 0:
                continue
            part = group[0].request.parts.costly
            seconds, result, why = _call(name, lambda: part.propose_costly([row.id for row in group], wanted))
            why = why or _broken(name, result.drafts, wanted)
            step.costly_seconds += seconds
            if why is not None:
                step.fail(group, why)
                continue
            for row, draft in zip(group, result.drafts):
                row.costly = draft
            # The positions it drafted, not those asked: a call that only caught up (a row still too far
            # behind to draft) drafted none, and its time is catch-up's alone.
            drafted = max(len(draft) for draft in result.drafts)
            step.drafting.append(DraftingTiming(group[0].source, drafted, seconds, result.pass_seconds,
                                                result.catch_up.tokens, result.catch_up.seconds))

    def chosen_drafts(self, step: Step) -> None:
        """The drafts this step verifies: the costly parts' (a constrained row's made legal, as free
        drafts were when drafted), and free drafts cut to their chosen lengths (a free draft the step
        leaves out is still checked, for free, against what the row emits: `unverified`)."""
        for row in step.live:
            draft = row.costly
            if draft is not None and row.request.grammar is not None:
                draft = self._legal(step, row, draft, row.length)
                if draft is None:
                    continue
            if draft is None:
                if row.waits:  # its costly part drafted nothing: verified with no draft
                    continue
                draft = row.free.prefix(row.length)
                if len(row.free) and not len(draft):
                    row.unverified = row.free
            if self._checked(step, row, draft):
                row.chosen = draft

    def _legal(self, step: Step, row: Row, draft: Draft, limit: int) -> Draft | None:
        """A constrained row's draft made legal (`constrain.legal`), its time and forced tokens noted on
        the row; None where the draft cannot be checked or the grammar failed (the row fails)."""
        if not self._checked(step, row, draft):  # the grammar takes vocabulary ids only
            return None
        legal = constrain.legal(row.request.grammar, draft, limit, row.request.parts.forced_tokens)
        row.grammar_seconds += legal.seconds
        if legal.error is not None:
            step.fail([row], legal.error)
            return None
        if legal.forced_from is not None:
            row.forced_from = legal.forced_from
        return legal.draft

    def _checked(self, step: Step, row: Row, draft: Draft) -> bool:
        """Whether the target can check the draft (the one check of a draft: the verifier takes what
        passes as it is); where it cannot, the row fails."""
        problem = draft.problem(self.verifier.vocab_size)
        if problem is not None:
            step.fail([row], f"drafter {row.request.drafter_name!r} proposed a draft the target cannot check: {problem}")
        return problem is None

    def verify(self, step: Step) -> None:
        """One verify pass over the live rows (the other running rows sit it out)."""
        rows = step.live
        batch = Batch.of([row.id for row in rows], [row.request.last_token for row in rows], [row.chosen for row in rows])
        started = time.perf_counter()
        verdict = self.verifier.step(batch)
        step.verify_seconds = time.perf_counter() - started
        step.steady = verdict.steady
        for r, row in enumerate(rows):
            row.verified = True
            row.grammar_seconds += float(verdict.grammar_seconds[r])
            if verdict.errors[r] is not None:
                step.fail([row], verdict.errors[r])
                continue
            row.tokens, row.accepted, row.logprobs = verdict.emitted(r), int(verdict.accepted[r]), verdict.logprobs[r]


def _call_free(name: str, parts: Parts, group: list[Row], batch: int, policy: DraftPolicy,
               asked: dict[str, bool]) -> bool:
    """Whether this step calls a drafter's free part: always a free one, or one with a row on the
    `fixed` policy; a measured one where a row may draft and the policy says its call pays."""
    if parts.free_cost is Cost.FREE or any(row.request.policy is Policy.FIXED for row in group):
        return True
    wanted = [row.limit for row in group]
    if not any(wanted):
        return False
    asked[name] = policy.worth_calling(name, [row.id for row in group], wanted, batch)
    return asked[name]


def _groups(rows: list[Row]) -> dict[str, list[Row]]:
    """The rows by drafter (under the name it is reported by: one object per name), in the order the
    drafters first appear."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.request.drafter_name, []).append(row)
    return groups


def _call(name: str, call: Callable[[], Any]) -> tuple[float, Any, str | None]:
    """A drafter's batched call, timed: (seconds, its result, None), or, where the drafter raises,
    (seconds, None, why its requests fail)."""
    start = time.perf_counter()
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its requests
        return time.perf_counter() - start, None, drafter_failure(name, exc)
    return time.perf_counter() - start, result, None


def _broken(name: str, drafts: Any, limits: list[int]) -> str | None:
    """How a call's drafts break the contract (one draft per request, none longer than asked), if they do."""
    if not isinstance(drafts, list) or len(drafts) != len(limits) or not all(isinstance(d, Draft) for d in drafts):
        count = len(drafts) if isinstance(drafts, list) else type(drafts).__name__
        return f"drafter {name!r} broke its contract: propose must return a list of {len(limits)} Drafts, got {count}"
    for draft, limit in zip(drafts, limits):
        if len(draft) > limit:
            return f"drafter {name!r} broke its contract: a draft of {len(draft)} tokens where at most {limit} were asked for"
    return None
