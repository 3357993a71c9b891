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
  suffix match, `ngram:copy1` after a 1-token one; measured on the embedded model, the first is
  accepted about three times as often, and pooling them made the policy verify the weak kind and
  price the strong one too low). Estimates start from the source's pooled estimate (a prior of PRIOR_WEIGHT
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
  cost is spread over the tokens it serves: the tokens the row may still generate times the share
  of steps in which the row's draft comes from that drafter (all of them for `model`; for `hybrid`,
  those where its n-gram part has no draft; learned per request from a pooled prior). O: the step's
  other host work. Nothing is hard-coded; everything is measured on this machine.
Packed, the candidates are the prefixes of all rows' draft positions sorted by their expected gain
prod_{j<=i} alpha_r[j] (a row's positions come in order: its gains only fall), once per cap on the
costly drafters' rows (a costly drafter costs a pass whatever the gain of its position, so its rows'
first positions must not stand in front of the free rows' weaker ones); padded, the widths.
A measured drafter (one that declares no parts) is asked for its drafts before the lengths are
chosen, so its call is paid whatever they are: before each call the policy weighs the call's
measured time against what the rows' drafts are expected to gain (their last draft lengths at their
estimated acceptance) and skips the call where it does not pay, calling anyway every EXPLORE_EVERY
skips so that a drafter that got better is seen again.
Plain decoding is kept unless a draft promises MARGIN more throughput (timings are noisy). Every
EXPLORE_EVERY choices the runner-up is taken if it is predicted close, so that a cost measured once
under load is measured again rather than trusted forever (but never one that pays a catch-up: that
is an investment, not a measurement; except for a costly source none of whose drafts was ever
verified, whose estimate is only the prior: without it a drafter that the prior prices too low, as
it did the int8 self-draft, accepted ~90% of the time, would never be measured).

While a row drafts nothing a cheap drafter's proposals are still checked for free against the tokens
the target then emits ("shadow" acceptance), so a row's estimate keeps learning without paying for a draft.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

PRIOR_WEIGHT = 4.0  # pseudo-observations of the drafter's pooled estimate in a request's estimate
DECAY = 0.9  # weight kept by old observations at each new one
IDLE_DECAY = 0.995  # weight kept per step in which a row could not be observed
INITIAL_ALPHA = 0.6  # a drafter's pooled estimate before it has any evidence (optimistic: explore first)
WINDOW = 7  # timings kept per cost: the estimate is their median
EMA = 0.2  # weight of a new timing of the other host work in its moving average
MARGIN = 0.03  # a draft must promise this much more throughput than plain decoding (timings are noisy)
EXPLORE_EVERY = 32  # every this many choices, try the runner-up if it is predicted close ...
EXPLORE_WITHIN = 0.8  # ... this close: its cost is measured afresh, so one bad timing does not stick


class Acceptance:
    """Acceptance evidence at draft positions 1..k: decayed trial and success counts."""

    def __init__(self, k: int) -> None:
        self.trials = np.zeros(k)
        self.hits = np.zeros(k)

    def observe(self, drafted: int, accepted: int, decay: float = DECAY) -> None:
        """A draft of `drafted` tokens of which the first `accepted` were accepted: positions
        1..accepted+1 were tried (the one after the last accepted failed), the first `accepted` hit."""
        tried = min(drafted, accepted + 1)
        self.trials *= decay
        self.hits *= decay
        self.trials[:tried] += 1.0
        self.hits[:accepted] += 1.0

    def forget(self, decay: float) -> None:
        self.trials *= decay
        self.hits *= decay

    def alpha(self, prior: np.ndarray, weight: float) -> np.ndarray:
        return (self.hits + weight * prior) / (self.trials + weight)

    def chained(self, prior: float, weight: float) -> np.ndarray:
        """The estimates with `prior` at every position tried, and at a position never tried the
        estimate at the position before it: a kind accepted far is priced far where no draft has
        reached yet, and drafting it there measures it. (Tried positions keep the flat prior: the
        first position's rate says little about later ones.)"""
        out = np.empty(len(self.trials))
        for j in range(len(out)):
            prior_j = out[j - 1] if j and self.trials[j] == 0.0 else prior
            out[j] = (self.hits[j] + weight * prior_j) / (self.trials[j] + weight)
        return out


@dataclass
class RowPlan:
    """One running row as the policy sees it. `cheap`: its draft was already proposed (`avail`
    tokens), else a costly part drafts it once its length is chosen. `drafter`: the source of the
    draft the row would get (a drafter's name, name:kind, or name/part). `fixed`: its request drafts
    all it can every step (the `fixed` policy)."""

    request_id: str
    drafter: str
    limit: int  # the longest draft this row may verify now (its k, its budget)
    cheap: bool
    avail: int  # cheap: the proposed draft's length; otherwise == limit
    backlog: int = 0  # costly: context tokens its drafter must catch up on before drafting this row
    remaining: int = 1  # tokens the row may still generate (the catch-up is an investment in them)
    fixed: bool = False


@dataclass
class _Shadow:
    tokens: list[int]
    source: str
    matched: int = 0


@dataclass
class _Request:
    drafter: str  # the default source
    acceptance: dict[str, Acceptance] = field(default_factory=dict)  # per source
    shadow: _Shadow | None = None
    # The decayed share of its steps whose draft would come from a costly drafter (one-position counts).
    costly: Acceptance = field(default_factory=lambda: Acceptance(1))
    proposed: dict[str, int] = field(default_factory=dict)  # measured drafter -> its last draft's length


class _Timings:
    """The last WINDOW timings of one cost and their median."""

    def __init__(self, seconds: float) -> None:
        self.recent: deque[float] = deque([seconds], maxlen=WINDOW)
        self.seconds = seconds

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.seconds = float(np.median(self.recent))


@dataclass
class CostModel:
    """Measured step costs: verify T(B, N) (B rows, N tokens computed), drafting D_d(n) per drafter,
    other host work O."""

    verify: dict[tuple[int, int], _Timings] = field(default_factory=dict)
    drafting: dict[str, _Timings] = field(default_factory=dict)  # source -> seconds per drafted token
    calls: dict[str, _Timings] = field(default_factory=dict)  # measured drafter -> seconds per call
    catch_up: dict[str, _Timings] = field(default_factory=dict)  # source -> seconds per caught-up token
    other: float = 0.0
    _fit: np.ndarray | None = None
    _stale: bool = True

    def observe_verify(self, batch: int, tokens: int, seconds: float) -> None:
        cell = self.verify.get((batch, tokens))
        if cell is None:
            self.verify[(batch, tokens)] = _Timings(seconds)
        else:
            cell.add(seconds)
        self._stale = True

    def observe_draft(self, drafter: str, tokens: int, seconds: float) -> None:
        self._per_token(self.drafting, drafter, tokens, seconds)

    def observe_catch_up(self, drafter: str, tokens: int, seconds: float) -> None:
        self._per_token(self.catch_up, drafter, tokens, seconds)

    @staticmethod
    def _per_token(costs: dict[str, _Timings], drafter: str, tokens: int, seconds: float) -> None:
        if tokens > 0:
            timings = costs.get(drafter)
            if timings is None:
                costs[drafter] = _Timings(seconds / tokens)
            else:
                timings.add(seconds / tokens)

    def observe_other(self, seconds: float) -> None:
        self.other += EMA * (seconds - self.other)

    def verify_seconds(self, batch: int, tokens: int) -> float:
        """A verify pass over `batch` rows computing `tokens` tokens."""
        if self._stale:
            self._refit()
        fitted = None
        if self._fit is not None:
            a, b, c = self._fit
            fitted = max(a + b * batch + c * tokens, 1e-9)
        cell = self.verify.get((batch, tokens))
        if cell is None:
            between = self._between(batch, tokens)
            return between if between is not None else (0.0 if fitted is None else fitted)
        if fitted is None or len(self.verify) < 4:
            return cell.seconds
        seen = len(cell.recent)  # one timing weighs as much as the fit; a full window nearly alone
        return (seen * cell.seconds + fitted) / (seen + 1)

    def _between(self, batch: int, tokens: int) -> float | None:
        """Linear between the nearest measured passes of this batch size below and above `tokens`
        (None where there are not both): the global fit is a line, and a pass's cost is not (the
        compiled CPU step runs passes of up to 8 tokens, larger ones are several times dearer), so
        between two measurements the measurements are the better guide."""
        below = max((n for b, n in self.verify if b == batch and n < tokens), default=None)
        above = min((n for b, n in self.verify if b == batch and n > tokens), default=None)
        if below is None or above is None:
            return None
        low, high = self.verify[(batch, below)].seconds, self.verify[(batch, above)].seconds
        return low + (high - low) * (tokens - below) / (above - below)

    def draft_seconds(self, drafter: str, tokens: int) -> float:
        timings = self.drafting.get(drafter)
        return 0.0 if timings is None else timings.seconds * tokens

    def observe_call(self, drafter: str, seconds: float) -> None:
        self._per_token(self.calls, drafter, 1, seconds)

    def call_seconds(self, drafter: str) -> float | None:
        timings = self.calls.get(drafter)
        return None if timings is None else timings.seconds

    def catch_up_seconds(self, drafter: str, tokens: int) -> float:
        timings = self.catch_up.get(drafter)
        return 0.0 if timings is None else timings.seconds * tokens

    def _refit(self) -> None:
        self._stale = False
        if len(self.verify) < 2:
            only = next(iter(self.verify.items()), None)
            self._fit = None if only is None else np.array([only[1].seconds, 0.0, 0.0])
            return
        keys = np.array(list(self.verify), dtype=np.float64)  # [cells, 2]
        times = np.array([c.seconds for c in self.verify.values()])
        design = np.stack([np.ones(len(keys)), keys[:, 0], keys[:, 1]], 1)
        self._fit = np.linalg.lstsq(design, times, rcond=None)[0]


class DraftPolicy:
    """Chooses each step's draft lengths. packed: the verify pass computes each row's real tokens
    (N = sum of 1 + n_r), else rows are padded to the longest draft (N = B x W).

    It learns what happened through one method per event: `verified` (a verify pass and its time),
    `drafted` (a costly part's drafting pass and catch-up), `called` (a measured drafter's call),
    `step_overhead` (the rest of a step), `observe` / `shadow` / `emitted` (acceptance)."""

    def __init__(self, max_k: int, packed: bool = False) -> None:
        self.max_k, self.packed = max_k, packed
        self.costs = CostModel()
        self._skipped: dict[str, int] = defaultdict(int)  # measured drafter -> calls skipped in a row
        self._pooled: dict[str, Acceptance] = defaultdict(lambda: Acceptance(max(max_k, 1)))
        self._requests: dict[str, _Request] = {}
        self._choices = 0
        # Per drafter, the pooled share of steps whose draft would come from a costly drafter (a decayed
        # ratio, kept as a one-position Acceptance).
        self._costly_share: dict[str, Acceptance] = defaultdict(lambda: Acceptance(1))

    def computed_tokens(self, lengths: Sequence[int]) -> int:
        """Tokens a verify pass with these draft lengths (one per row) computes."""
        if self.packed:
            return sum(1 + n for n in lengths)
        return len(lengths) * (1 + max(lengths, default=0))

    # -- requests ------------------------------------------------------------------------------
    def begin(self, request_id: str, drafter: str) -> None:
        self._requests[request_id] = _Request(drafter)

    def end(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _acceptance(self, request: _Request, source: str) -> Acceptance:
        if source not in request.acceptance:
            request.acceptance[source] = Acceptance(max(self.max_k, 1))
        return request.acceptance[source]

    def alpha(self, request_id: str, source: str | None = None) -> np.ndarray:
        """The request's estimated acceptance at draft positions 1..max_k, for drafts from `source`
        (default: the request's drafter)."""
        request = self._requests[request_id]
        source = source or request.drafter
        prior = self._pooled[source].chained(INITIAL_ALPHA, PRIOR_WEIGHT)
        return self._acceptance(request, source).alpha(prior, PRIOR_WEIGHT)

    def _costly_fraction(self, request_id: str) -> float:
        """The share of the request's steps in which its draft comes from a costly drafter (all for
        `model`; for `hybrid`, where its n-gram part has no draft): the tokens a catch-up serves."""
        request = self._requests[request_id]
        prior = self._costly_share[request.drafter].alpha(np.ones(1), 1.0)
        return float(request.costly.alpha(prior, PRIOR_WEIGHT)[0])

    def expected_accepted(self, request_id: str, n: int, source: str | None = None) -> float:
        if n <= 0:
            return 0.0
        return float(np.cumprod(self.alpha(request_id, source)[:n]).sum())

    # -- the choice ------------------------------------------------------------------------------
    def choose(self, plans: Sequence[RowPlan]) -> dict[str, int]:
        """Each row's draft length this step (0: plain decoding for that row)."""
        for plan in plans:
            request = self._requests[plan.request_id]
            request.costly.observe(1, int(not plan.cheap))
            self._costly_share[request.drafter].observe(1, int(not plan.cheap), decay=0.99)
        if not any(p.avail for p in plans if not p.fixed):  # nothing to choose
            return {p.request_id: p.avail if p.fixed else 0 for p in plans}
        gains = {p.request_id: np.cumprod(self.alpha(p.request_id, p.drafter)[: p.avail]) for p in plans}
        candidates, tokens, computed = self._packed(plans, gains) if self.packed else self._padded(plans, gains)
        costly = [p for p in plans if not p.cheap and p.avail]
        # Tokens each costly row's catch-up serves (see the module docstring): fixed for this step.
        served = {p.request_id: self._costly_fraction(p.request_id) * p.remaining for p in costly if p.backlog}
        seconds = np.zeros(len(candidates))
        if costly:
            for i, lengths in enumerate(candidates):
                depth: dict[str, int] = {}  # a costly drafter runs one pass per position its longest row drafts
                for plan in costly:
                    n = lengths[plan.request_id]
                    if n:
                        depth[plan.drafter] = max(depth.get(plan.drafter, 0), n)
                        if plan.backlog:  # this step's share of the tokens the catch-up serves
                            share = min(1.0, (1.0 + gains[plan.request_id][:n].sum()) / max(served[plan.request_id], 1.0))
                            seconds[i] += share * self.costs.catch_up_seconds(plan.drafter, plan.backlog)
                seconds[i] += sum(self.costs.draft_seconds(d, n) for d, n in depth.items())
        batch = len(plans)
        # Computing more tokens never costs less; noisy timings must not say otherwise.
        widths = np.arange(computed.max() + 1)
        verify = np.maximum.accumulate([self.costs.verify_seconds(batch, int(n)) if n >= batch else 0.0 for n in widths])
        rates = tokens / np.maximum(verify[computed] + self.costs.other + seconds, 1e-9)
        best = int(np.argmax(rates))
        chosen = best if rates[best] > rates[0] * (1 + MARGIN) else 0
        self._choices += 1
        # Explore only where a step's cost is re-measured, never into a catch-up (a one-off investment
        # in a row that its estimates say does not pay), unless no draft of the costly source was ever
        # verified: its estimate is the prior alone, and one catch-up measures it for later requests too.
        catching_up = [p.request_id for p in costly if p.backlog and self._pooled[p.drafter].trials.any()]
        explorable = [i for i in range(len(rates)) if i != chosen and not any(candidates[i][r] for r in catching_up)]
        if self._choices % EXPLORE_EVERY == 0 and explorable:
            runner_up = max(explorable, key=lambda i: rates[i])
            if rates[runner_up] >= EXPLORE_WITHIN * rates[chosen]:
                chosen = runner_up
        return candidates[chosen]

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
        """Whether a measured drafter's call is expected to pay this step: what its rows' drafts (as
        long as their last ones, at their estimated acceptance) gain against the call's measured time
        (see the module docstring). `batch`: the rows the step verifies."""
        seconds = self.costs.call_seconds(drafter)
        if seconds is None or not any(limits):
            return bool(any(limits))
        lengths = [min(self._requests[r].proposed.get(drafter, n), n) for r, n in zip(request_ids, limits)]
        gain = sum(self.expected_accepted(r, n, drafter) for r, n in zip(request_ids, lengths))
        plain = self.costs.verify_seconds(batch, self.computed_tokens([0] * batch)) + self.costs.other
        drafting = self.costs.verify_seconds(batch, self.computed_tokens([*lengths, *[0] * (batch - len(lengths))]))
        # A call that costs less than the noise in a step's timing is never worth skipping: its next
        # draft may be better than its last.
        cheap = seconds <= MARGIN * plain
        if cheap or (batch + gain) / max(drafting + self.costs.other + seconds, 1e-9) > batch / max(plain, 1e-9) * (1 + MARGIN):
            self._skipped[drafter] = 0
            return True
        self._skipped[drafter] += 1
        return self._skipped[drafter] % EXPLORE_EVERY == 0  # now and then, see whether it pays now

    # -- what happened -----------------------------------------------------------------------------
    def verified(self, lengths: Sequence[int], seconds: float) -> None:
        """A verify pass over rows with these draft lengths took `seconds`."""
        self.costs.observe_verify(len(lengths), self.computed_tokens(lengths), seconds)

    def drafted(self, source: str, positions: int, seconds: float, pass_seconds: float | None,
                catch_up_tokens: int = 0, catch_up_seconds: float = 0.0) -> None:
        """A costly part drafted up to `positions` tokens a row in `seconds`: priced by its own timing
        of one drafting pass where it gives one (its catching up is priced apart), else by the call."""
        if pass_seconds is not None:
            self.costs.observe_draft(source, 1, pass_seconds)
        elif positions:
            self.costs.observe_draft(source, positions, seconds)
        self.costs.observe_catch_up(source, catch_up_tokens, catch_up_seconds)

    def called(self, drafter: str, request_ids: Sequence[str], lengths: Sequence[int], seconds: float) -> None:
        """A measured drafter's call took `seconds` and proposed drafts of these lengths."""
        self.costs.observe_call(drafter, seconds)
        for request_id, n in zip(request_ids, lengths):
            request = self._requests.get(request_id)
            if request is not None:
                request.proposed[drafter] = n

    def step_overhead(self, seconds: float) -> None:
        """A step's host work besides verifying and drafting."""
        self.costs.observe_other(seconds)

    def observe(self, request_id: str, drafted: int, accepted: int, source: str | None = None) -> None:
        """A verified draft from `source`: `drafted` tokens, of which the first `accepted` were accepted."""
        request = self._requests[request_id]
        if drafted > 0:
            source = source or request.drafter
            self._acceptance(request, source).observe(drafted, accepted)
            self._pooled[source].observe(drafted, accepted, decay=0.99)
        else:
            for acceptance in request.acceptance.values():
                acceptance.forget(IDLE_DECAY)

    def shadow(self, request_id: str, proposed: Sequence[int], source: str | None = None) -> None:
        """A cheap drafter proposed `proposed` but the step verified none of it: check it against the
        tokens the row emits next, for free."""
        request = self._requests[request_id]
        if request.shadow is None and len(proposed):
            request.shadow = _Shadow(list(proposed), source or request.drafter)

    def emitted(self, request_id: str, tokens: Sequence[int]) -> None:
        """Tokens the row emitted this step: they settle a pending shadow draft."""
        request = self._requests.get(request_id)
        if request is None or request.shadow is None:
            return
        shadow = request.shadow
        for token in tokens:
            if token != shadow.tokens[shadow.matched]:
                break
            shadow.matched += 1
            if shadow.matched == len(shadow.tokens):
                break
        else:
            return  # all emitted tokens matched and the draft goes on: wait for more
        request.shadow = None
        self._acceptance(request, shadow.source).observe(len(shadow.tokens), shadow.matched)
        self._pooled[shadow.source].observe(len(shadow.tokens), shadow.matched, decay=0.99)
