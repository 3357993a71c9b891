"""The request loop: admits requests, prefills them in chunks between decode steps, has each
request's drafter propose, lets the cost-aware policy (`specdraft.policy`) set the step's draft
length, verifies every running row in one pass, applies stop rules (EOS, stop strings, max_tokens,
context limit) and reports per-request metrics.

Each request names its drafter, its longest draft and its policy (`SpeculationParams`; the engine
owns the defaults of all three); the engine holds the drafters, built and warmed once, by name, and
asks each only what the drafter contract declares (`specdraft.drafters.base`): each step reads as

    plan -> free drafts -> lengths -> costly drafts -> verify -> emit

The engine is synchronous and single-threaded; a server runs it on one thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from specdraft.backend import PREFILL_CHUNK
from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter, Parts, parts_of
from specdraft.errors import RequestError
from specdraft.grammar import GrammarCompiler, GrammarError, RowGrammar
from specdraft.params import SamplingParams, SpeculationParams, check_num_speculative_tokens, check_policy
from specdraft.policy import DraftPolicy, RowPlan
from specdraft.text import IncrementalDetokenizer
from specdraft.verifier import GrammarFailedError, InvalidDraftError, StepResult, Verifier

log = logging.getLogger("specdraft.engine")
# Draft lengths (below k) that calibration times one row at, besides 0 and k: passes of 2, 4, 8, 9,
# 16 and 32 tokens, where a step's cost may change regime (the compiled CPU step takes up to 8).
CALIBRATION_LENGTHS = (1, 3, 7, 8, 15, 31)


@dataclass
class RequestMetrics:
    k: int
    drafter: str = ""
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_at: np.ndarray = None  # [k] how often a draft reached position i
    accepted_at: np.ndarray = None  # [k] how often position i was accepted
    draft_seconds: float = 0.0
    constrained: bool = False  # the request has a response format
    grammar_seconds: float = 0.0  # its masks, cutting its drafts, its forced tokens
    forced_draft_tokens: int = 0  # verified tokens the grammar forced, where the draft before them was accepted
    forced_accepted_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None

    def __post_init__(self) -> None:
        self.drafted_at = np.zeros(self.k, dtype=np.int64)
        self.accepted_at = np.zeros(self.k, dtype=np.int64)

    def record(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted_per_step.append(accepted)
        self.drafted_at[:drafted] += 1
        self.accepted_at[:accepted] += 1

    def to_dict(self, generated: int, complete: bool | None = None) -> dict:
        """complete: for a constrained request, whether its output is a whole JSON value."""
        elapsed = (self.finished or time.perf_counter()) - self.started
        drafted = self.drafted_at[self.drafted_at > 0]
        grammar = {} if not self.constrained else {"grammar": {
            "complete": complete,
            "seconds": self.grammar_seconds,
            "forced_draft_tokens": self.forced_draft_tokens,
            "forced_accepted_tokens": self.forced_accepted_tokens,
        }}
        return {
            "drafter": self.drafter,
            "steps": self.steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            "mean_accepted_length": self.accepted_tokens / self.steps if self.steps else 0.0,
            "per_position_acceptance": (self.accepted_at[: len(drafted)] / drafted).round(4).tolist(),
            "drafted_at": self.drafted_at.tolist(),
            "accepted_at": self.accepted_at.tolist(),
            "accepted_per_step": list(self.accepted_per_step),
            "draft_seconds": self.draft_seconds,
            "seconds": elapsed,
            "time_to_first_token": (self.first_token - self.started) if self.first_token else None,
            "tokens_per_second": generated / elapsed if elapsed > 0 else 0.0,
            **grammar,
        }


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    drafter: str
    k: int  # longest draft per step
    policy: str  # how each step's draft length is chosen (`specdraft.params.POLICIES`)
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    last_token: int | None = None
    error: str | None = None  # why the request failed (finish_reason "error")
    prefilled: int = 0  # prompt tokens in the target's cache
    begun: bool = False  # its drafter and the policy track it
    grammar: RowGrammar | None = None  # its response format's state (the verifier advances it)
    stop_string: bool = False  # it ended on a stop string (its text is cut there)


@dataclass(frozen=True)
class Delta:
    """New output of one request after a step. `finish_reason` is set on its last delta. `accepted`
    of `token_ids` came from the request's draft (they lead), the rest from the target itself;
    `drafted_text` is the part of `text` that the accepted draft tokens produced (a prefix of it)."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None
    accepted: int = 0
    drafted_text: str = ""


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    metrics: dict
    error: str | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_token_ids": self.prompt_token_ids,
            "finish_reason": self.finish_reason,
            "metrics": self.metrics,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class _Drafts:
    """What a drafting stage produced: drafts by row, the policy's source name of each row's draft
    (set by the free stage, for costly rows too), the rows left for costly parts (by drafter), the
    stage's seconds and the rows whose drafter failed; for constrained rows whose draft ends in
    tokens the grammar forced, where those start."""

    drafts: dict[str, Draft] = field(default_factory=dict)
    forced_from: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    costly: dict[str, list[Request]] = field(default_factory=dict)
    seconds: float = 0.0
    failed: list[Delta] = field(default_factory=list)


class Engine:
    """verifier: the target; drafters: prebuilt drafters by name (`default_drafter` serves requests
    that name none: the first by default); k: the longest draft a request may ask for (its default);
    policy: how requests that name none choose draft lengths (`auto`: the cost-aware policy;
    `fixed`: as long as the drafter goes, every step); calibrate: time a few verify steps and costly
    drafts at start so that the policy starts from measurements; prefill_budget: prompt tokens
    prefilled per step while other requests decode; grammar: compiles requests' response formats
    (None: requests with one are refused)."""

    def __init__(
        self,
        verifier: Verifier,
        drafters: Mapping[str, Drafter],
        tokenizer,
        eos_token_ids: Sequence[int],
        max_context: int,
        k: int = 5,
        max_batch: int = 8,
        default_drafter: str | None = None,
        policy: str = "auto",
        calibrate: bool = True,
        prefill_budget: int = PREFILL_CHUNK,
        grammar: GrammarCompiler | None = None,
    ) -> None:
        check_num_speculative_tokens(k, "k")
        check_policy(policy)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not drafters:
            raise ValueError("an engine needs at least one drafter (`none` for plain decoding)")
        self.verifier, self.drafters, self.tokenizer, self.grammar = verifier, dict(drafters), tokenizer, grammar
        self.default_drafter = default_drafter or next(iter(self.drafters))
        if self.default_drafter not in self.drafters:
            raise ValueError(f"default drafter {self.default_drafter!r} is not one of {sorted(self.drafters)}")
        self.parts: dict[str, Parts] = {name: parts_of(drafter) for name, drafter in self.drafters.items()}
        for parts in self.parts.values():
            if parts.target_cache:
                parts.costly.share_target(verifier.rows)
        self.default_policy = policy
        self.eos = frozenset(eos_token_ids)
        self.max_context, self.k, self.max_batch, self.prefill_budget = max_context, k, max_batch, prefill_budget
        self.policy = DraftPolicy(k, packed=verifier.packs)
        self._waiting: deque[Request] = deque()
        self._prefilling: deque[Request] = deque()
        self._running: dict[str, Request] = {}
        self._ids = itertools.count()
        self._done: dict[str, Request] = {}  # finished requests not yet collected
        self.prefill_seconds = 0.0  # time spent prefilling the target with prompts (the same whatever drafts)
        if calibrate:
            self._calibrate()

    # -- submission ----------------------------------------------------------------------
    def validate(self, prompt_ids: Sequence[int], speculation: SpeculationParams | None = None,
                 params: SamplingParams | None = None) -> SpeculationParams:
        """Raise RequestError if this engine cannot serve the request (its response format included,
        when `params` are given); return its speculation settings with the defaults filled in. Reads
        only the engine's fixed configuration and the grammar compiler (which locks): safe from any thread."""
        if params is not None and params.response_format is not None:
            self._grammar_of(params)
        speculation = speculation or SpeculationParams()
        drafter = speculation.drafter or self.default_drafter
        if not len(prompt_ids):
            raise RequestError("prompt is empty: give at least one token")
        if len(prompt_ids) >= self.max_context:
            raise RequestError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_context}, leaving no room to generate"
            )
        if drafter not in self.drafters:
            raise RequestError(f"drafter {drafter!r} is not available here; choose one of: {', '.join(sorted(self.drafters))}")
        k = self.k if speculation.num_speculative_tokens is None else speculation.num_speculative_tokens
        if k > self.k:
            raise RequestError(f"num_speculative_tokens {k} is above this engine's maximum of {self.k}")
        return SpeculationParams(drafter, k, speculation.policy or self.default_policy)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, speculation: SpeculationParams | None = None,
               request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        speculation = self.validate(prompt_ids, speculation)
        grammar = self._grammar_of(params) if params.response_format is not None else None
        k = speculation.num_speculative_tokens
        request_id = request_id or f"req-{next(self._ids)}"
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        self._waiting.append(Request(request_id, prompt_ids, params, speculation.drafter, k, speculation.policy, detok,
                                     RequestMetrics(k, speculation.drafter, constrained=grammar is not None),
                                     grammar=grammar))
        return request_id

    def _grammar_of(self, params: SamplingParams) -> RowGrammar:
        if self.grammar is None:
            raise RequestError("response_format is not available: this engine was built without a grammar compiler")
        if not self.eos:
            raise RequestError("response_format is not available: this engine has no end-of-sequence token to end the JSON with")
        try:
            return self.grammar.matcher(params.response_format)
        except GrammarError as exc:
            raise RequestError(str(exc)) from None

    def cancel(self, request_id: str) -> None:
        """Stop a request now; its rows and drafter state are freed (it is collected as "cancelled")."""
        for queue in (self._waiting, self._prefilling):
            for request in list(queue):
                if request.id == request_id:
                    queue.remove(request)
                    if queue is self._prefilling:
                        self.verifier.remove(request.id)
                    request.finish_reason = "cancelled"
                    self._done[request.id] = request
        if request_id in self._running:
            self._retire(self._running[request_id])

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._running)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._prefilling)

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> list[Delta]:
        """Admit waiting requests, prefill up to `prefill_budget` prompt tokens (all of them when no
        request is decoding), then one verify pass over the running rows. A request whose prefill
        ends in this step also takes part in its verify pass, so it may get two deltas."""
        deltas: list[Delta] = []
        while self._waiting and len(self._running) + len(self._prefilling) < self.max_batch:
            request = self._waiting.popleft()
            self.verifier.add(request.id, request.params, request.grammar)
            self._prefilling.append(request)
        self._prefill(deltas)
        if self._running:
            deltas.extend(self._decode())
        return deltas

    def _prefill(self, deltas: list[Delta]) -> None:
        budget = self.prefill_budget if self._running else None
        while self._prefilling and (budget is None or budget > 0):
            request = self._prefilling[0]
            rest = len(request.prompt_ids) - request.prefilled
            take = rest if budget is None else min(rest, budget)
            piece = request.prompt_ids[request.prefilled : request.prefilled + take]
            started = time.perf_counter()
            try:
                first = self.verifier.prefill(request.id, piece, last=take == rest)
            except GrammarFailedError as exc:
                self._prefilling.popleft()
                self._running[request.id] = request
                deltas.append(self._fail(request, str(exc)))
                continue
            self.prefill_seconds += time.perf_counter() - started
            request.prefilled += take
            if budget is not None:
                budget -= take
            if first is None:
                continue
            self._prefilling.popleft()
            self._running[request.id] = request
            try:
                self.drafters[request.drafter].begin(request.id, request.prompt_ids, request.params)
            except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its request
                deltas.append(self._fail(request, f"drafter {request.drafter!r} failed: {type(exc).__name__}: {exc}"))
                continue
            self.policy.begin(request.id, request.drafter)
            request.begun = True
            request.metrics.first_token = time.perf_counter()
            delta = self._emit(request, [first])
            if delta.finish_reason is not None:
                self._retire(request)
            deltas.append(delta)

    def _decode(self) -> list[Delta]:
        """One verify pass over the running rows, as its stages."""
        started = time.perf_counter()
        rows = [self._running[r] for r in self.verifier.row_ids]
        limits = {r.id: max(0, min(r.k, self._remaining(r) - 1)) for r in rows}  # the step adds one token
        free = self._free_drafts(rows, limits)
        rows = [r for r in rows if r.finish_reason is None]
        lengths = self.policy.choose(self._plans(rows, limits, free))
        costly = self._costly_drafts(free, lengths)
        drafts = self._step_drafts(rows, free, costly, lengths)
        rows = [r for r in rows if r.finish_reason is None]
        failed = free.failed + costly.failed
        if not rows:
            return failed
        verify_started = time.perf_counter()
        results, invalid = self._verify(rows, drafts)
        verify_seconds = time.perf_counter() - verify_started
        if results:
            self.policy.verified([len(drafts.get(r.id, EMPTY_DRAFT)) for r in rows if r.id in results], verify_seconds)
        draft_seconds = free.seconds + costly.seconds
        deltas = failed + invalid + self._emit_step(rows, drafts, results, free, draft_seconds)
        self.policy.step_overhead(time.perf_counter() - started - verify_seconds - draft_seconds)
        return deltas

    # -- the step's stages -------------------------------------------------------------------------
    def _free_drafts(self, rows: list[Request], limits: dict[str, int]) -> _Drafts:
        """Each drafter's free or measured part drafts its rows at full length, so that the policy sees
        what they have (a measured part only where its call pays, see `DraftPolicy.worth_calling`);
        rows it leaves without a draft go to the drafter's costly part, if it has one."""
        out = _Drafts()
        for name, group in self._groups(rows).items():
            parts = self.parts[name]
            drafted: dict[str, Draft] = {}
            if parts.free is not None and self._worth_calling(name, parts, group, limits, len(rows)):
                wanted = [limits[r.id] for r in group]
                seconds, drafts, failed = self._call(name, group, lambda: parts.free.propose([r.id for r in group], wanted))
                if not failed:
                    drafted, failed = self._by_row(name, group, drafts, wanted)
                out.seconds += seconds
                out.failed += failed
                if parts.free_cost == "measured" and not failed:
                    self.policy.called(name, [r.id for r in group], [len(drafted[r.id]) for r in group], seconds)
            for request in group:
                draft = drafted.get(request.id, EMPTY_DRAFT)
                if request.finish_reason is not None:
                    continue
                if request.grammar is not None:
                    try:
                        draft = self._legal(request, draft, limits[request.id], parts.forced_tokens, out.forced_from)
                    except GrammarError as exc:  # that request's grammar failed: it ends, the others go on
                        out.failed.append(self._fail(request, str(exc)))
                        continue
                if len(draft) or parts.costly is None:
                    out.drafts[request.id] = draft
                    out.sources[request.id] = f"{name}:{draft.kind}" if draft.kind else name
                else:
                    out.costly.setdefault(name, []).append(request)
                    out.sources[request.id] = name if parts.free is None else f"{name}/{parts.costly_name}"
        return out

    def _worth_calling(self, name: str, parts: Parts, group: list[Request], limits: dict[str, int], batch: int) -> bool:
        if parts.free_cost == "free" or any(r.policy == "fixed" for r in group):
            return True
        return self.policy.worth_calling(name, [r.id for r in group], [limits[r.id] for r in group], batch)

    def _plans(self, rows: list[Request], limits: dict[str, int], free: _Drafts) -> list[RowPlan]:
        """The rows as the policy sees them: what a free draft has, or what a costly part may draft."""
        plans = []
        for request in rows:
            cheap = request.id in free.drafts
            avail = len(free.drafts[request.id]) if cheap else limits[request.id]
            backlog = 0 if cheap else self.parts[request.drafter].costly.backlog(request.id)
            plans.append(RowPlan(request.id, free.sources[request.id], limits[request.id], cheap, avail, backlog,
                                 self._remaining(request), request.policy == "fixed"))
        return plans

    def _costly_drafts(self, free: _Drafts, lengths: dict[str, int]) -> _Drafts:
        """Each costly part drafts its rows at the lengths the policy chose (where any is above 0)."""
        out = _Drafts()
        for name, group in free.costly.items():
            group = [r for r in group if r.finish_reason is None]
            wanted = [lengths[r.id] for r in group]
            if max(wanted, default=0) == 0:
                continue
            part = self.parts[name].costly
            seconds, result, failed = self._call(name, group, lambda: part.propose_costly([r.id for r in group], wanted))
            out.seconds += seconds
            if not failed:
                drafted, failed = self._by_row(name, group, result.drafts, wanted)
                out.drafts.update(drafted)
            out.failed += failed
            if not failed:
                self.policy.drafted(free.sources[group[0].id], max(wanted), seconds, result.pass_seconds,
                                    result.catch_up.tokens, result.catch_up.seconds)
        return out

    def _legal(self, request: Request, draft: Draft, limit: int, forced: bool, forced_from: dict[str, int]) -> Draft:
        """A constrained row's draft cut before its first token the grammar forbids (an illegal token
        is never verified), then, where the drafter allows (`Parts.forced_tokens`), extended up to
        `limit` tokens by the tokens the grammar forces after it (where they start: `forced_from`)."""
        start = time.perf_counter()
        tokens = draft.token_ids.tolist()
        if tokens and not 0 <= min(tokens) <= max(tokens) < self.verifier.vocab_size:
            return draft  # the verifier refuses it, naming the token, as for any request
        legal = request.grammar.legal_prefix(tokens)
        extra = request.grammar.forced(tokens[:legal], limit - legal) if forced else []
        request.metrics.grammar_seconds += time.perf_counter() - start
        if legal == len(tokens) and not extra:
            return draft
        if extra:
            forced_from[request.id] = legal
        if not legal and not extra:
            return EMPTY_DRAFT
        # Kept tokens lose q: a constrained row's drafts are tested as deterministic (`specdraft.verifier`).
        return Draft(np.asarray(tokens[:legal] + extra, dtype=np.int32), None, draft.kind if legal else "forced")

    def _step_drafts(self, rows: list[Request], free: _Drafts, costly: _Drafts, lengths: dict[str, int]) -> dict[str, Draft]:
        """The drafts this step verifies: free drafts cut to their chosen lengths (a free draft the
        step leaves out is still checked, for free, against what the row emits), and costly drafts
        (a constrained row's made legal, as free drafts were when drafted)."""
        drafts = dict(costly.drafts)
        for request in rows:
            if request.grammar is not None and request.id in drafts and request.finish_reason is None:
                try:
                    drafts[request.id] = self._legal(request, drafts[request.id], lengths[request.id],
                                                     self.parts[request.drafter].forced_tokens, free.forced_from)
                except GrammarError as exc:  # reported with the costly stage's failures
                    del drafts[request.id]
                    costly.failed.append(self._fail(request, str(exc)))
            draft = free.drafts.get(request.id)
            if draft is None or request.finish_reason is not None:
                continue
            n = lengths.get(request.id, 0)
            drafts[request.id] = draft.prefix(n)
            if len(draft) and not n:
                self.policy.shadow(request.id, draft.token_ids.tolist(), free.sources[request.id])
        return drafts

    def _verify(self, rows: list[Request], drafts: dict[str, Draft]) -> tuple[dict[str, StepResult], list[Delta]]:
        """One verify pass; a row whose draft the verifier cannot check fails, the others go on."""
        failed: list[Delta] = []
        while rows:
            try:
                results = self.verifier.step({r.id: r.last_token for r in rows},
                                             {r.id: drafts[r.id] for r in rows if len(drafts.get(r.id, EMPTY_DRAFT))})
            except (InvalidDraftError, GrammarFailedError) as exc:  # that request fails, the others go on
                failed.append(self._fail(self._running[exc.row_id], str(exc)))
                rows = [r for r in rows if r.id != exc.row_id]
                continue
            return results, failed
        return {}, failed

    def _emit_step(self, rows: list[Request], drafts: dict[str, Draft], results: dict[str, StepResult],
                   free: _Drafts, draft_seconds: float) -> list[Delta]:
        """Tell the policy and each request what the step accepted, and emit each row's tokens."""
        verified = [r for r in rows if r.id in results]
        deltas = []
        share = draft_seconds / len(rows)
        for request in verified:
            result, drafted = results[request.id], len(drafts.get(request.id, EMPTY_DRAFT))
            request.metrics.record(drafted, result.accepted)
            request.metrics.draft_seconds += share
            request.metrics.grammar_seconds += result.grammar_seconds
            begin = free.forced_from.get(request.id, drafted)
            if result.accepted >= begin:  # the forced tokens were reached: the draft before them was accepted
                request.metrics.forced_draft_tokens += drafted - begin
                request.metrics.forced_accepted_tokens += result.accepted - begin
            self.policy.observe(request.id, drafted, result.accepted, free.sources[request.id])
            self.policy.emitted(request.id, result.tokens)
            if result.error is not None:  # its grammar failed after the pass: it ends, the others go on
                deltas.append(self._fail(request, result.error))
                continue
            delta = self._emit(request, result.tokens, result.accepted)
            if delta.finish_reason is not None:
                self._retire(request)
            deltas.append(delta)
        return deltas

    def _groups(self, rows: list[Request]) -> dict[str, list[Request]]:
        groups: dict[str, list[Request]] = {}
        for request in rows:
            groups.setdefault(request.drafter, []).append(request)
        return groups

    def _call(self, name: str, group: list[Request], call):
        """A drafter's batched call, timed: (seconds, its result, []), or, where the drafter raises,
        (seconds, None, the failures of its requests): a drafter's fault fails its own requests only."""
        start = time.perf_counter()
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its requests
            return time.perf_counter() - start, None, self._fail_all(group, f"drafter {name!r} failed: {type(exc).__name__}: {exc}")
        return time.perf_counter() - start, result, []

    def _by_row(self, name: str, group: list[Request], drafts, lengths: list[int]) -> tuple[dict[str, Draft], list[Delta]]:
        """A call's drafts by row, after checking that it kept the contract (one draft per request,
        none longer than asked)."""
        if not isinstance(drafts, list) or len(drafts) != len(group) or not all(isinstance(d, Draft) for d in drafts):
            count = len(drafts) if isinstance(drafts, list) else type(drafts).__name__
            return {}, self._fail_all(group, f"drafter {name!r} broke its contract: propose must return a list of "
                                             f"{len(group)} Drafts, got {count}")
        for draft, limit in zip(drafts, lengths):
            if len(draft) > limit:
                return {}, self._fail_all(group, f"drafter {name!r} broke its contract: a draft of {len(draft)} tokens "
                                                 f"where at most {limit} were asked for")
        return {r.id: d for r, d in zip(group, drafts)}, []

    def _fail_all(self, group: list[Request], error: str) -> list[Delta]:
        return [self._fail(r, error) for r in group if r.finish_reason is None]

    def _remaining(self, request: Request) -> int:
        used = len(request.prompt_ids) + len(request.generated)
        return min(request.params.max_tokens - len(request.generated), self.max_context - used)

    def _emit(self, request: Request, tokens: list[int], accepted: int = 0) -> Delta:
        kept: list[int] = []
        for token in tokens:
            kept.append(token)
            if token in self.eos and not request.params.ignore_eos:
                request.finish_reason = "stop"
                break
            if len(request.generated) + len(kept) >= request.params.max_tokens:
                request.finish_reason = "length"
                break
        request.generated.extend(kept)
        if request.finish_reason is None and self._remaining(request) <= 0:
            request.finish_reason = "length"  # the model's context is full
        accepted = min(accepted, len(kept))
        # Draft tokens first, then the target's own: the text of each part, for clients that show it.
        drafted_text, hit_stop = request.detok.add(kept[:accepted]) if accepted else ("", False)
        text = drafted_text
        if not hit_stop and accepted < len(kept):
            rest, hit_stop = request.detok.add(kept[accepted:])
            text += rest
        if hit_stop:
            request.finish_reason, request.stop_string = "stop", True
        if request.finish_reason is None:
            request.last_token = kept[-1]
            try:
                self.drafters[request.drafter].accept(request.id, kept)
            except Exception as exc:  # noqa: BLE001 - the drafter's fault: its request ends, with what it has
                request.finish_reason = "error"
                request.error = f"drafter {request.drafter!r} failed: {type(exc).__name__}: {exc}"
        if request.finish_reason is not None:
            text += request.detok.flush()
        return Delta(request.id, kept, text, request.finish_reason, request.error, accepted=accepted,
                     drafted_text=drafted_text)

    @staticmethod
    def _complete(request: Request) -> bool:
        """Whether a constrained request's text is a whole JSON value (a stop string cuts the text
        short of the tokens: after a whole value only the end-of-sequence token is legal)."""
        return request.grammar.complete(len(request.generated)) and not request.stop_string

    def _fail(self, request: Request, error: str) -> Delta:
        request.finish_reason, request.error = "error", error
        self._retire(request)
        return Delta(request.id, [], request.detok.flush(), "error", error)

    def _retire(self, request: Request) -> None:
        request.metrics.finished = time.perf_counter()
        self.verifier.remove(request.id)
        if request.begun:
            request.begun = False
            self.policy.end(request.id)
            try:
                self.drafters[request.drafter].end(request.id)
            except Exception:  # noqa: BLE001 - the request is over either way; its drafter's fault is logged
                log.exception("drafter %r failed to end request %s", request.drafter, request.id)
        del self._running[request.id]
        if request.finish_reason is None:
            request.finish_reason = "cancelled"
        self._done[request.id] = request

    # -- start-up measurements -------------------------------------------------------------
    def _calibrate(self) -> None:
        """Time verify steps at the corners of (batch, width) (and, where the verifier packs rows,
        one row drafting k in a full batch: what a few strong drafts cost there) and each drafter
        that drafts only when asked, on throwaway rows, so that the policy's first choices rest on
        this machine's costs."""
        prompt = [int(t) % self.verifier.vocab_size for t in range(3, 3 + max(32, self.k + 1))]  # drafts of k fit
        greedy = SamplingParams(max_tokens=4 * (self.k + 1) + 4)
        draft = Draft(np.asarray(prompt[: self.k], dtype=np.int32))
        for batch in sorted({1, self.max_batch}):
            ids = [f"__calibrate-{i}" for i in range(batch)]
            for row_id in ids:
                self.verifier.admit(row_id, prompt, greedy)
            if batch == 1:  # one row at several lengths: a pass's cost need not be linear in its tokens
                cases = [[n] for n in sorted({0, self.k, *(n for n in CALIBRATION_LENGTHS if n < self.k)})]
            else:  # how many rows draft k
                drafting = {0, batch} if self.k else {0}
                if self.k and self.verifier.packs:
                    drafting.add(1)
                cases = [[self.k] * rows + [0] * (batch - rows) for rows in sorted(drafting)]
            for lengths in cases:
                times = []
                for _ in range(4):  # the first call pays one-off allocation and kernel selection
                    start = time.perf_counter()
                    self.verifier.step({r: prompt[-1] for r in ids},
                                       {r: draft.prefix(n) for r, n in zip(ids, lengths) if n})
                    times.append(time.perf_counter() - start)
                    for row_id in ids:
                        self.verifier.truncate(row_id, len(prompt))
                self.policy.verified(lengths, float(np.median(times[1:])))
            for row_id in ids:
                self.verifier.remove(row_id)
        for name, parts in self.parts.items():
            if parts.costly is None or not self.k:
                continue
            drafter, source = self.drafters[name], name if parts.free is None else f"{name}/{parts.costly_name}"
            for request_id in ("__calibrate", "__calibrate-again"):  # the first request warms up
                drafter.begin(request_id, prompt, greedy)
                for round_ in range(4):  # the first round catches up on the prompt (priced apart)
                    start = time.perf_counter()
                    result = parts.costly.propose_costly([request_id], [self.k])
                    [draft] = result.drafts
                    if len(draft) and request_id != "__calibrate":
                        self.policy.drafted(source, len(draft), time.perf_counter() - start, result.pass_seconds,
                                            result.catch_up.tokens, result.catch_up.seconds)
                    # As a step that accepts the whole draft: its tokens and the target's next one.
                    drafter.accept(request_id, [*draft.token_ids.tolist(), prompt[round_]])
                drafter.end(request_id)

    # -- conveniences --------------------------------------------------------------------
    def run(self, requests: Iterable[tuple], speculation: SpeculationParams | None = None) -> list[Completion]:
        """Decode all requests together (continuous batching) and return them in order. Each item is
        (prompt_ids, SamplingParams) or (prompt_ids, SamplingParams, SpeculationParams)."""
        ids = [self.submit(*item) if len(item) == 3 else self.submit(item[0], item[1], speculation) for item in requests]
        while self.has_work:
            self.step()
        return [self.collect(i) for i in ids]

    def collect(self, request_id: str) -> Completion:
        """The finished request's completion (each finished request is collected once)."""
        request = self._done.pop(request_id)
        return Completion(
            request.id,
            request.detok.text,
            list(request.generated),
            list(request.prompt_ids),
            request.finish_reason,
            request.metrics.to_dict(len(request.generated),
                                    None if request.grammar is None else self._complete(request)),
            request.error,
        )
