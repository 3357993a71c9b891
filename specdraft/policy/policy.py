"""Cost-aware draft length: speculation that never costs more than it gives.

Each step the engine verifies every running row in one forward pass, and the policy picks each row's
draft length n_r (0 = plain decoding for that row) to maximise the batch's expected tokens per second:

    rate(n) = sum_r (1 + E_r(n_r)) / (T(B, N) + sum_d [D_d(max n_r over d's rows) + C_d(its drafting rows)] + O)

- N: the tokens the pass computes. Where the verifier packs rows (our own forward on the host or an
  eager GPU pass: `Verifier.packs`), N = sum_r (1 + n_r): a row that drafts nothing adds one token, so
  in a large batch a few rows with strong drafts can draft while the rest decode plainly. Where it
  pads them (static shapes, the stock forward), N = B x W, W = 1 + the longest draft, and every
  row drafts min(W - 1, what it has): a shorter draft is no cheaper there.
- E_r(n) = sum_{i<=n} prod_{j<=i} alpha_r[j]: expected accepted tokens of row r from a draft of n,
  alpha_r[j] its estimated acceptance at draft position j given the positions before were accepted.
  Estimates are per request and per *source*: a drafter, one part of a drafter that drafts two
  ways (`hybrid` copies with its n-gram part for free and asks its model otherwise: `hybrid/model`),
  and the kind of draft it says it proposed (`Draft.kind`: `ngram:copy4` is a copy after a 4-token
  suffix match, `ngram:copy1` after a 1-token one: kinds differ far more than requests do, and
  pooling them would verify the weak kind and price the strong one too low). Estimates start from the source's pooled estimate (a prior of PRIOR_WEIGHT
  observations) and forget old evidence (DECAY per observation, and slowly while the row does not
  draft), so a request whose drafts stop working stops drafting, and one that starts copying resumes.
  The pooled estimate at a position has the one at the position before as its prior, so positions
  no draft has reached yet (a long copy's 9th token) are priced as the last one measured, not as
  unknown: a kind accepted far gets drafted far, which measures it there.
- n_r is at most what a free or measured drafter (`ngram`, a drafter that declares nothing) already
  proposed, or the request's limit for a costly part that drafts only when asked (`model`,
  `hybrid/model`; see `specdraft.drafters.base.Parts`). A row whose request asks for the `fixed`
  policy drafts all of that, every step; the others are chosen around it.
- T(B, N): the verify step's measured time (per (B, N) cell, the median of its last WINDOW timings,
  so that one slow step (a page fault, another process) does not stick, blended with a least-squares
  fit a + b*B + c*N over all cells while the cell has few timings; a cell not yet seen is read off
  the line between the nearest measured cells of its batch size around it, or else from the fit,
  seeded by a short calibration at start-up at several lengths). D_d(n): measured time of drafter d drafting n
  tokens for its rows (one pass per draft position: n * the median of its last WINDOW per-token
  timings; a drafter that times its own drafting passes, leaving out catching up on steps it sat
  out, gives those). C_d: the catching up drafter d must do before it drafts rows that it sat out
  (`RowPlan.backlog` tokens each, at its measured per-token cost), a new request's whole prompt the
  first time. Once caught up, a row that the drafter keeps drafting for does not pay again, so the
  cost is spread over the tokens it serves: the tokens the row is expected to generate still (at most
  its room; how long finished replies ran, `lengths.py`) times the share
  of steps in which the row's draft comes from that drafter (all of them for `model`; for `hybrid`,
  those where its n-gram part has no draft; learned per request from a pooled prior). O: the step's
  other host work. Nothing is hard-coded; everything is measured on this machine.
Packed, the candidates are the prefixes of all rows' draft positions sorted by their expected gain
prod_{j<=i} alpha_r[j] (a row's positions come in order: its gains only fall), once per cap on the
costly drafters' rows (a costly drafter costs a pass whatever the gain of its position, so its rows'
first positions must not stand in front of the free rows' weaker ones); padded, the widths.
A measured drafter (one that declares no parts) is asked for its drafts before the lengths are
chosen, so its call is paid whatever they are: before each call the policy weighs the call's
measured time against what the rows' drafts are expected to gain (their decayed mean draft lengths at
their estimated acceptance) and skips the call where it does not pay, calling anyway every EXPLORE_EVERY
skips so that a drafter that got better is seen again.
Plain decoding is kept unless a draft promises MARGIN more throughput (timings are noisy). Every
EXPLORE_EVERY choices the runner-up is taken if it is predicted close, so that a cost measured once
under load is measured again rather than trusted forever (but never one that pays a catch-up: that
is an investment, not a measurement; except for a costly source none of whose drafts was ever
verified, whose estimate is only the prior: without it a drafter that the prior prices too low
would never be measured).

While a row drafts nothing a cheap drafter's proposals are still checked for free against the tokens
the target then emits ("shadow" acceptance), so a row's estimate keeps learning without paying for a draft.

The engine asks (`worth_calling`, `choose`: neither changes the policy) and tells the policy what
each step did once, after it (`record`), besides `begin` and `end` of each request. The estimates
live in `estimates.py`, the costs in `costs.py`, what the policy is asked and told in `report.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Sequence

import numpy as np

from specdraft.policy.costs import CostModel
from specdraft.policy.estimates import Acceptance, Estimates
from specdraft.policy.lengths import ReplyLengths
from specdraft.policy.report import RowPlan, StepReport

MARGIN = 0.03  # a draft must promise this much more throughput than plain decoding (timings are noisy)
EXPLORE_EVERY = 32  # every this many choices, try the runner-up if it is predicted close ...
EXPLORE_WITHIN = 0.8  # ... this close: its cost is measured afresh, so one bad timing does not stick


class DraftPolicy:
    """Chooses each step's draft lengths. packed: the verify pass computes each row's real tokens
    (N = sum of 1 + n_r), else rows are padded to the longest draft (N = B x W)."""

    def __init__(self, max_k: int, packed: bool = False) -> None:
        self.max_k, self.packed = max_k, packed
        self.costs = CostModel()
        self.estimates = Estimates(max_k)
        self.lengths = ReplyLengths()
        self._skipped: dict[str, int] = {}  # measured drafter -> calls skipped since its last call
        self._choices = 0  # choices made with something to choose

    def computed_tokens(self, lengths: Sequence[int]) -> int:
        """Tokens a verify pass with these draft lengths (one per row) computes."""
        if self.packed:
            return sum(1 + n for n in lengths)
        return len(lengths) * (1 + max(lengths, default=0))

    # -- requests --------------------------------------------------------------------------------
    def begin(self, request_id: str, drafter: str) -> None:
        self.estimates.begin(request_id, drafter)

    def end(self, request_id: str, generated: int, ended: bool) -> None:
        """A request is over, `generated` tokens long; `ended`: by itself (a stop), not cut at its limit."""
        self.estimates.end(request_id)
        self.lengths.record(generated, ended)

    @property
    def pooled(self) -> Mapping[str, Acceptance]:
        """Each source's acceptance pooled over requests (the prior of a request's own estimate)."""
        return self.estimates.pooled

    def alpha(self, request_id: str, source: str | None = None) -> np.ndarray:
        return self.estimates.alpha(request_id, source)

    def expected_accepted(self, request_id: str, n: int, source: str | None = None) -> float:
        return self.estimates.expected_accepted(request_id, n, source)

    # -- questions (they change nothing) -----------------------------------------------------------
    def choose(self, plans: Sequence[RowPlan]) -> dict[str, int]:
        """Each row's draft length this step (0: plain decoding for that row)."""
        if not _has_choice(plans):
            return {p.request_id: p.avail if p.fixed else 0 for p in plans}
        if (self._choices + 1) % EXPLORE_EVERY and self._costly_cannot_pay(plans):
            return {p.request_id: 0 for p in plans}
        gains = {p.request_id: np.cumprod(self.alpha(p.request_id, p.source)[: p.avail]) for p in plans}
        candidates, tokens, computed = self._packed(plans, gains) if self.packed else self._padded(plans, gains)
        costly = [p for p in plans if not p.cheap and p.avail]
        # Tokens each costly row's catch-up serves (see the module docstring): fixed for this step.
        fractions = self.estimates.costly_fractions(plans) if any(p.backlog for p in costly) else {}
        served = {p.request_id: fractions[p.request_id] * self.lengths.served(p.generated, p.remaining)
                  for p in costly if p.backlog}
        seconds = np.zeros(len(candidates))
        if costly:
            for i, lengths in enumerate(candidates):
                depth: dict[str, int] = {}  # a costly drafter runs one pass per position its longest row drafts
                for plan in costly:
                    n = lengths[plan.request_id]
                    if n:
                        depth[plan.source] = max(depth.get(plan.source, 0), n)
                        if plan.backlog:  # this step's share of the tokens the catch-up serves
                            share = min(1.0, (1.0 + gains[plan.request_id][:n].sum()) / max(served[plan.request_id], 1.0))
                            seconds[i] += share * self.costs.catch_up_seconds(plan.source, plan.backlog)
                seconds[i] += sum(self.costs.draft_seconds(d, n) for d, n in depth.items())
        batch = len(plans)
        # Computing more tokens never costs less; noisy timings must not say otherwise.
        widths = np.arange(computed.max() + 1)
        verify = np.maximum.accumulate([self.costs.verify_seconds(batch, int(n)) if n >= batch else 0.0 for n in widths])
        rates = tokens / np.maximum(verify[computed] + self.costs.other + seconds, 1e-9)
        best = int(np.argmax(rates))
        chosen = best if rates[best] > rates[0] * (1 + MARGIN) else 0
        # Explore only where a step's cost is re-measured, never into a catch-up (a one-off investment
        # in a row that its estimates say does not pay), unless no draft of the costly source was ever
        # verified: its estimate is the prior alone, and one catch-up measures it for later requests too.
        catching_up = [p.request_id for p in costly if p.backlog and self.estimates.measured(p.source)]
        explorable = [i for i in range(len(rates)) if i != chosen and not any(candidates[i][r] for r in catching_up)]
        if (self._choices + 1) % EXPLORE_EVERY == 0 and explorable:
            runner_up = max(explorable, key=lambda i: rates[i])
            if rates[runner_up] >= EXPLORE_WITHIN * rates[chosen]:
                chosen = runner_up
        return candidates[chosen]

    def _plain_seconds(self, batch: int) -> float:
        """A plain step of `batch` rows: its verify pass and the step's other host work."""
        return self.costs.verify_seconds(batch, self.computed_tokens([0] * batch)) + self.costs.other

    def _costly_cannot_pay(self, plans: Sequence[RowPlan]) -> bool:
        """Whether plain decoding wins this step before any candidate is priced: every row with a
        choice waits for a costly drafter (no free draft, no fixed row), and each such drafter's pass
        for one position costs at least its rows' share of a plain step (c_d / B of T(B, B) + O, c_d
        its rows of B). A draft n deep gains at most n tokens a row and costs at least n of its passes
        (and a pass computing more tokens never costs less; catching up only adds), so no candidate
        beats plain decoding, and `choose` would return it: it is returned here without pricing them
        (pricing is a step's host work, on a CPU after a pass has left the caches cold). Exploration steps price
        them anyway (the caller)."""
        if any(p.fixed or (p.cheap and p.avail) for p in plans):
            return False
        rows: dict[str, int] = {}
        for plan in plans:
            if plan.avail:
                rows[plan.source] = rows.get(plan.source, 0) + 1
        batch = len(plans)
        plain = self._plain_seconds(batch)
        return plain > 0 and all(self.costs.draft_seconds(source, 1) * batch >= count * plain
                                 for source, count in rows.items())

    @staticmethod
    def _padded(plans: Sequence[RowPlan], gains: dict[str, np.ndarray]) -> tuple[list[dict[str, int]], np.ndarray, np.ndarray]:
        """Widths W = 1 + n, every row drafting min(n, what it has), n at least what the fixed rows
        draft; their expected and computed tokens."""
        longest = max(p.avail for p in plans)
        floor = max((p.avail for p in plans if p.fixed), default=0)
        widths = range(floor, longest + 1)
        curves = [np.concatenate([[1.0], 1.0 + np.cumsum(gains[p.request_id])]) for p in plans]  # [avail + 1]
        tokens = np.array([sum(c[min(n, len(c) - 1)] for c in curves) for n in widths])
        candidates = [{p.request_id: min(n, p.avail) for p in plans} for n in widths]
        return candidates, tokens, len(plans) * (1 + np.arange(floor, longest + 1))

    @staticmethod
    def _packed(plans: Sequence[RowPlan], gains: dict[str, np.ndarray]) -> tuple[list[dict[str, int]], np.ndarray, np.ndarray]:
        """Prefixes of the rows' draft positions by expected gain, best first (a row's gains only
        fall, so each prefix drafts a prefix of every row's draft); their expected and computed tokens.
        Fixed rows draft all they have in every candidate.

        A costly drafter's price is paid by the step as soon as one of its rows drafts, whatever the
        gain of that row's positions, so a costly row's strong first position must not stand between
        the free rows and their weaker positions. The prefixes are taken once per cap on the costly
        rows' draft lengths (0: free drafts only, up to the longest allowed)."""
        chosen = [p for p in plans if not p.fixed]
        costly = {p.request_id for p in chosen if not p.cheap and p.avail}
        caps = range(1 + max((p.avail for p in chosen if p.request_id in costly), default=0))
        base = {p.request_id: p.avail if p.fixed else 0 for p in plans}
        candidates: list[dict[str, int]] = [base]
        tokens = [len(plans) + sum(float(gains[p.request_id].sum()) for p in plans if p.fixed)]
        computed = [len(plans) + sum(base.values())]
        for cap in caps:
            positions = sorted((-float(g), j, p.request_id) for p in chosen for j, g in enumerate(gains[p.request_id])
                               if p.request_id not in costly or j < cap)
            lengths, expected, depth = dict(base), tokens[0], 0
            for m, (gain, _, request_id) in enumerate(positions, 1):
                lengths[request_id] += 1
                expected -= gain
                if request_id in costly:
                    depth = max(depth, lengths[request_id])
                if depth == cap:  # a prefix whose costly rows draft less than `cap` came with a smaller cap
                    candidates.append(dict(lengths))
                    tokens.append(expected)
                    computed.append(computed[0] + m)
        return candidates, np.array(tokens), np.array(computed)

    def worth_calling(self, drafter: str, request_ids: Sequence[str], limits: Sequence[int], batch: int) -> bool:
        """Whether a measured drafter's call is expected to pay this step: what its rows' drafts (of their
        decayed mean lengths, at their estimated acceptance) gain against the call's measured time
        (see the module docstring); a call that does not pay is made anyway every EXPLORE_EVERY
        times it is asked about. `batch`: the rows the step verifies."""
        seconds = self.costs.call_seconds(drafter)
        if seconds is None or not any(limits):
            return bool(any(limits))
        lengths = [self.estimates.proposed(r, drafter, n) for r, n in zip(request_ids, limits)]
        gain = sum(self.expected_accepted(r, n, drafter) for r, n in zip(request_ids, lengths))
        plain = self._plain_seconds(batch)
        drafting = self.costs.verify_seconds(batch, self.computed_tokens([*lengths, *[0] * (batch - len(lengths))]))
        # A call that costs less than the noise in a step's timing is never worth skipping: its next
        # draft may be better than its last.
        cheap = seconds <= MARGIN * plain
        if cheap or (batch + gain) / max(drafting + self.costs.other + seconds, 1e-9) > batch / max(plain, 1e-9) * (1 + MARGIN):
            return True
        return (self._skipped.get(drafter, 0) + 1) % EXPLORE_EVERY == 0  # now and then, see whether it pays now

    # -- what happened -----------------------------------------------------------------------------
    def record(self, report: StepReport) -> None:
        """Learn from one step (or one measurement outside a step: calibration)."""
        for drafter, called in report.asked.items():
            self._skipped[drafter] = 0 if called else self._skipped.get(drafter, 0) + 1
        for call in report.calls:
            self.costs.observe_call(call.drafter, call.seconds)
            self.estimates.observe_call(call)
        if report.plans:
            self.estimates.observe_plans(report.plans)
            self._choices += _has_choice(report.plans)
        for drafting in report.drafting:
            # Priced by the part's own timing of one drafting pass where it gives one, else by the call
            # over the positions it drafted; its catching up is priced apart, never as drafting.
            if drafting.pass_seconds is not None:
                self.costs.observe_draft(drafting.source, 1, drafting.pass_seconds)
            elif drafting.positions:
                self.costs.observe_draft(drafting.source, drafting.positions,
                                         max(drafting.seconds - drafting.catch_up_seconds, 0.0))
            self.costs.observe_catch_up(drafting.source, drafting.catch_up_tokens, drafting.catch_up_seconds)
        if report.verify is not None and report.verify.steady:
            lengths = report.verify.lengths
            self.costs.observe_verify(len(lengths), self.computed_tokens(lengths), report.verify.seconds)
        self.estimates.observe(report.rows)
        if report.other_seconds is not None:
            self.costs.observe_other(report.other_seconds)


def _has_choice(plans: Sequence[RowPlan]) -> bool:
    """Whether a row that is not fixed has anything to draft."""
    return any(p.avail for p in plans if not p.fixed)
