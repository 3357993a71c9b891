"""Acceptance estimates: per request and per source, each with the source's pooled estimate as its
prior, forgetting old evidence; the share of a request's steps a costly drafter serves; and shadow
drafts, a cheap drafter's proposals that a step left out, checked for free against what the row then
emits. Read by `DraftPolicy.choose` without changing them; changed only by what a step reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from specdraft.policy.report import CallTiming, RowPlan, Verified

PRIOR_WEIGHT = 4.0  # pseudo-observations of the source's pooled estimate in a request's estimate
DECAY = 0.9  # weight a request's old observations keep at each new one
POOLED_DECAY = 0.99  # weight a pooled estimate's old observations keep at each new one (many requests feed it)
IDLE_DECAY = 0.995  # weight kept per step in which a row could not be observed
INITIAL_ALPHA = 0.6  # a source's pooled estimate before it has any evidence (optimistic: explore first)
PROPOSED_PRIOR_WEIGHT = 1.0  # pseudo-proposals of the request's limit in a measured drafter's expected length


class Acceptance:
    """Acceptance evidence at draft positions 1..k: decayed trial and success counts."""

    def __init__(self, k: int) -> None:
        self.trials = np.zeros(k)
        self.hits = np.zeros(k)

    def copy(self) -> Acceptance:
        out = Acceptance(len(self.trials))
        out.trials[:], out.hits[:] = self.trials, self.hits
        return out

    def observe(self, drafted: int, accepted: int, decay: float = DECAY) -> None:
        """A draft of `drafted` tokens of which the first `accepted` were accepted: positions
        1..accepted+1 were tried (the one after the last accepted failed), the first `accepted` hit."""
        tried = min(drafted, accepted + 1)
        self.forget(decay)
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
class _Proposed:
    """A measured drafter's decayed mean draft length for one request. Its first proposals start from
    the request's limit as PROPOSED_PRIOR_WEIGHT earlier proposals, forgotten like any other: one empty
    draft (a copying drafter whose last token has not occurred before) says little about the next, and
    taking it alone would skip a cheap drafter's calls until the next exploration."""

    total: float = 0.0
    weight: float = 0.0
    prior: float = PROPOSED_PRIOR_WEIGHT

    def observe(self, n: int) -> None:
        self.total, self.weight, self.prior = DECAY * self.total + n, DECAY * self.weight + 1.0, DECAY * self.prior

    def mean(self, limit: int) -> float:
        return (self.total + self.prior * limit) / (self.weight + self.prior)


@dataclass
class _Shadow:
    tokens: list[int]
    source: str
    matched: int = 0


@dataclass
class _Request:
    drafter: str  # the default source, and the pool of its costly share
    acceptance: dict[str, Acceptance] = field(default_factory=dict)  # per source
    shadow: _Shadow | None = None
    # The decayed share of its steps whose draft would come from a costly drafter (one-position counts).
    costly: Acceptance = field(default_factory=lambda: Acceptance(1))
    proposed: dict[str, _Proposed] = field(default_factory=dict)  # measured drafter -> its draft lengths


class Estimates:
    """Every acceptance estimate of one policy, for drafts of up to `max_k` tokens."""

    def __init__(self, max_k: int) -> None:
        self.width = max(max_k, 1)
        self.pooled: dict[str, Acceptance] = {}  # per source
        self._requests: dict[str, _Request] = {}
        self._costly_share: dict[str, Acceptance] = {}  # per drafter, pooled over its requests

    def begin(self, request_id: str, drafter: str) -> None:
        self._requests[request_id] = _Request(drafter)

    def end(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    # -- reading ---------------------------------------------------------------------------------
    def alpha(self, request_id: str, source: str | None = None) -> np.ndarray:
        """The request's estimated acceptance at draft positions 1..max_k, for drafts from `source`
        (default: the request's drafter)."""
        request = self._requests[request_id]
        source = source or request.drafter
        prior = self.pooled.get(source, Acceptance(self.width)).chained(INITIAL_ALPHA, PRIOR_WEIGHT)
        return request.acceptance.get(source, Acceptance(self.width)).alpha(prior, PRIOR_WEIGHT)

    def expected_accepted(self, request_id: str, n: int, source: str | None = None) -> float:
        if n <= 0:
            return 0.0
        return float(np.cumprod(self.alpha(request_id, source)[:n]).sum())

    def measured(self, source: str) -> bool:
        """Whether any draft from `source` was ever verified (else its estimate is the prior alone)."""
        pooled = self.pooled.get(source)
        return pooled is not None and bool(pooled.trials.any())

    def proposed(self, request_id: str, drafter: str, limit: int) -> int:
        """The length a measured drafter is expected to propose for the request (its decayed mean, at
        most `limit`; `limit` before its first proposal)."""
        proposed = self._requests[request_id].proposed.get(drafter)
        return limit if proposed is None else min(limit, round(proposed.mean(limit)))

    def costly_fractions(self, plans: Sequence[RowPlan]) -> dict[str, float]:
        """Per planned row, the share of its steps in which its draft comes from a costly drafter (all
        for `model`; for `hybrid`, where its n-gram part has no draft): the tokens a catch-up serves.
        Counted with the step these plans make, as `observe_plans` will count it."""
        requests = {p.request_id: self._requests[p.request_id] for p in plans}
        mine = {r: request.costly.copy() for r, request in requests.items()}
        shares = {request.drafter: self._share(request.drafter).copy() for request in requests.values()}
        self._count_plans(plans, mine, shares)
        return {r: float(mine[r].alpha(shares[request.drafter].alpha(np.ones(1), 1.0), PRIOR_WEIGHT)[0])
                for r, request in requests.items()}

    def _share(self, drafter: str) -> Acceptance:
        return self._costly_share.get(drafter) or Acceptance(1)

    def _count_plans(self, plans: Sequence[RowPlan], mine: dict[str, Acceptance],
                     shares: dict[str, Acceptance]) -> None:
        for plan in plans:
            costly = int(not plan.cheap)
            mine[plan.request_id].observe(1, costly)
            shares[self._requests[plan.request_id].drafter].observe(1, costly, decay=POOLED_DECAY)

    # -- learning --------------------------------------------------------------------------------
    def observe_plans(self, plans: Sequence[RowPlan]) -> None:
        """A step planned these rows: count which would draft with a costly drafter."""
        requests = {p.request_id: self._requests[p.request_id] for p in plans}
        for request in requests.values():
            self._costly_share.setdefault(request.drafter, Acceptance(1))
        self._count_plans(plans, {r: request.costly for r, request in requests.items()}, self._costly_share)

    def observe_call(self, call: CallTiming) -> None:
        for request_id, n in call.proposed.items():
            request = self._requests.get(request_id)
            if request is not None:
                request.proposed.setdefault(call.drafter, _Proposed()).observe(n)

    def observe(self, rows: Iterable[Verified]) -> None:
        """What each verified row drafted, accepted and emitted: its estimates learn from its draft, a
        free draft the step left out waits for the tokens that settle it (shadow), and the emitted
        tokens settle a waiting one."""
        for row in rows:
            request = self._requests[row.request_id]
            if request.shadow is None and len(row.unverified):
                request.shadow = _Shadow(list(row.unverified), row.source)
            if row.drafted > 0:
                self._learn(request, row.source, row.drafted, row.accepted)
            else:
                for acceptance in request.acceptance.values():
                    acceptance.forget(IDLE_DECAY)
            self._settle(request, row.tokens)

    def _learn(self, request: _Request, source: str, drafted: int, accepted: int) -> None:
        if source not in request.acceptance:
            request.acceptance[source] = Acceptance(self.width)
        request.acceptance[source].observe(drafted, accepted)
        if source not in self.pooled:
            self.pooled[source] = Acceptance(self.width)
        self.pooled[source].observe(drafted, accepted, decay=POOLED_DECAY)

    def _settle(self, request: _Request, tokens: Sequence[int]) -> None:
        """Tokens the row emitted: they settle a pending shadow draft."""
        shadow = request.shadow
        if shadow is None:
            return
        for token in tokens:
            if token != shadow.tokens[shadow.matched]:
                break
            shadow.matched += 1
            if shadow.matched == len(shadow.tokens):
                break
        else:
            return  # all emitted tokens matched and the draft goes on: wait for more
        request.shadow = None
        self._learn(request, shadow.source, len(shadow.tokens), shadow.matched)
