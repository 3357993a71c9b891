"""The request loop: admits requests, prefills them in chunks between decode steps, has each
request's drafter propose, lets the cost-aware policy (`specdraft.policy`) set the step's draft
length, verifies every running row in one pass, applies stop rules (EOS, stop strings, max_tokens,
context limit) and reports per-request metrics.

Each request names its drafter and its longest draft (`SpeculationParams`); the engine holds the
drafters, built and warmed once, by name, and calls each one's batched `propose` once per step for
the rows that use it. The engine is synchronous and single-threaded; a server runs it on one thread.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter
from specdraft.errors import RequestError
from specdraft.params import SamplingParams, SpeculationParams, check_num_speculative_tokens
from specdraft.policy import DraftPolicy, RowPlan
from specdraft.text import IncrementalDetokenizer
from specdraft.verifier import InvalidDraftError, Verifier

PREFILL_BUDGET = 512  # prompt tokens prefilled per step while other requests decode


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

    def to_dict(self, generated: int) -> dict:
        elapsed = (self.finished or time.perf_counter()) - self.started
        drafted = self.drafted_at[self.drafted_at > 0]
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
        }


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    drafter: str
    k: int  # longest draft per step
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    last_token: int | None = None
    error: str | None = None  # why the request failed (finish_reason "error")
    prefilled: int = 0  # prompt tokens in the target's cache
    begun: bool = False  # its drafter and the policy track it


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


class Engine:
    """verifier: the target; drafters: prebuilt drafters by name (`default_drafter` serves requests
    that name none: the first by default); k: the longest draft a request may ask for (its default);
    adaptive: the cost-aware draft length (False: every step drafts as long as allowed);
    calibrate: time a few verify steps and drafts at start so that the policy starts from measurements."""

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
        adaptive: bool = True,
        calibrate: bool = True,
        prefill_budget: int = PREFILL_BUDGET,
    ) -> None:
        check_num_speculative_tokens(k, "k")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if not drafters:
            raise ValueError("an engine needs at least one drafter (`none` for plain decoding)")
        self.verifier, self.drafters, self.tokenizer = verifier, dict(drafters), tokenizer
        self.default_drafter = default_drafter or next(iter(self.drafters))
        if self.default_drafter not in self.drafters:
            raise ValueError(f"default drafter {self.default_drafter!r} is not one of {sorted(self.drafters)}")
        self.eos = frozenset(eos_token_ids)
        self.max_context, self.k, self.max_batch, self.prefill_budget = max_context, k, max_batch, prefill_budget
        self.policy = DraftPolicy(k, adaptive=adaptive, packed=verifier.packs)
        self._waiting: deque[Request] = deque()
        self._prefilling: deque[Request] = deque()
        self._running: dict[str, Request] = {}
        self._ids = itertools.count()
        self._done: dict[str, Request] = {}  # finished requests not yet collected
        self.prefill_seconds = 0.0  # time spent prefilling the target with prompts (the same whatever drafts)
        if calibrate:
            self._calibrate()

    # -- submission ----------------------------------------------------------------------
    def validate(self, prompt_ids: Sequence[int], speculation: SpeculationParams | None = None) -> SpeculationParams:
        """Raise RequestError if this engine cannot serve the request; return its speculation settings
        with the defaults filled in. Reads only the engine's fixed configuration: safe from any thread."""
        speculation = speculation or SpeculationParams(self.default_drafter)
        if not len(prompt_ids):
            raise RequestError("prompt is empty: give at least one token")
        if len(prompt_ids) >= self.max_context:
            raise RequestError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_context}, leaving no room to generate"
            )
        if speculation.drafter not in self.drafters:
            raise RequestError(f"drafter {speculation.drafter!r} is not available here; choose one of: {', '.join(sorted(self.drafters))}")
        k = self.k if speculation.num_speculative_tokens is None else speculation.num_speculative_tokens
        if k > self.k:
            raise RequestError(f"num_speculative_tokens {k} is above this engine's maximum of {self.k}")
        return SpeculationParams(speculation.drafter, k)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, speculation: SpeculationParams | None = None,
               request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        speculation = self.validate(prompt_ids, speculation)
        k = speculation.num_speculative_tokens
        request_id = request_id or f"req-{next(self._ids)}"
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        self._waiting.append(Request(request_id, prompt_ids, params, speculation.drafter, k, detok,
                                     RequestMetrics(k, speculation.drafter)))
        return request_id

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
            self.verifier.add(request.id, request.params)
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
            first = self.verifier.prefill(request.id, piece, last=take == rest)
            self.prefill_seconds += time.perf_counter() - started
            request.prefilled += take
            if budget is not None:
                budget -= take
            if first is None:
                continue
            self._prefilling.popleft()
            self._running[request.id] = request
            self.drafters[request.drafter].begin(request.id, request.prompt_ids, request.params)
            self.policy.begin(request.id, request.drafter)
            request.begun = True
            request.metrics.first_token = time.perf_counter()
            delta = self._emit(request, [first])
            if delta.finish_reason is not None:
                self._retire(request)
            deltas.append(delta)

    def _decode(self) -> list[Delta]:
        started = time.perf_counter()
        running = [self._running[r] for r in self.verifier.row_ids]
        limits = {r.id: max(0, min(r.k, self._remaining(r) - 1)) for r in running}  # the step adds one token
        groups: dict[str, list[Request]] = {}
        for request in running:
            groups.setdefault(request.drafter, []).append(request)
        deltas: list[Delta] = []
        drafts: dict[str, Draft] = {}
        proposed: dict[str, Draft] = {}  # free drafts, proposed at full length
        source = {r.id: r.drafter for r in running}  # where each row's draft comes from, for the policy
        costly: dict[str, list[Request]] = {}  # drafter -> rows it drafts for only once the length is known
        draft_seconds = 0.0
        # Free drafts first, at full length: the policy then sees what they actually have. A drafter
        # with a free and a costly part (`hybrid`) offers its free drafts here and drafts the rest later.
        for name, group in groups.items():
            drafter = self.drafters[name]
            free = "propose" if getattr(drafter, "cheap", False) else "propose_free" if hasattr(drafter, "propose_free") else None
            if free:
                seconds, out = self._propose(name, group, [limits[r.id] for r in group], deltas, free)
                draft_seconds += seconds
                proposed.update((r, d) for r, d in out.items() if d is not None)
                for request_id, draft in out.items():  # the policy learns acceptance per kind of draft
                    if draft is not None and draft.kind:
                        source[request_id] = f"{name}:{draft.kind}"
                rest = [r for r in group if r.id in out and out[r.id] is None]
                for request in rest:
                    source[request.id] = f"{name}/{drafter.costly_part}"
            else:
                rest = group
            if rest:
                costly[name] = rest
        running = [r for r in running if r.finish_reason is None]
        plans = [RowPlan(r.id, source[r.id], limits[r.id], r.id in proposed,
                         len(proposed[r.id]) if r.id in proposed else limits[r.id], self._backlog(r, proposed),
                         self._remaining(r)) for r in running]
        chosen = self.policy.choose(plans)
        for name, group in costly.items():
            group = [r for r in group if r.finish_reason is None]
            lengths = [chosen[r.id] for r in group]
            if max(lengths, default=0) > 0:
                method = "propose_costly" if hasattr(self.drafters[name], "propose_costly") else "propose"
                seconds, out = self._propose(name, group, lengths, deltas, method)
                draft_seconds += seconds
                self._observe_draft(name, source[group[0].id], max(lengths), seconds)
                drafts.update(out)
        for request_id, draft in proposed.items():
            n = chosen.get(request_id, 0)
            trimmed = draft if len(draft) <= n else Draft(
                draft.token_ids[:n], None if draft.probs is None else draft.probs[:n], draft.kind)
            drafts[request_id] = trimmed if len(trimmed) else EMPTY_DRAFT
            if len(draft) and not n:
                self.policy.shadow(request_id, draft.token_ids.tolist(), source[request_id])
        running = [r for r in running if r.finish_reason is None]
        if not running:
            return deltas
        verify_started = time.perf_counter()
        results = self._verify(running, drafts, deltas)
        verify_seconds = time.perf_counter() - verify_started
        if results:
            lengths = [len(drafts.get(r.id, EMPTY_DRAFT)) for r in running if r.id in results]
            self.policy.costs.observe_verify(len(results), self.policy.computed_tokens(lengths), verify_seconds)
        share = draft_seconds / max(len(running), 1)
        for request in running:
            if request.id not in results:
                continue
            result, drafted = results[request.id], len(drafts.get(request.id, EMPTY_DRAFT))
            request.metrics.record(drafted, result.accepted)
            request.metrics.draft_seconds += share
            self.policy.observe(request.id, drafted, result.accepted, source[request.id])
            self.policy.emitted(request.id, result.tokens)
            delta = self._emit(request, result.tokens, result.accepted)
            if delta.finish_reason is not None:
                self._retire(request)
            deltas.append(delta)
        self.policy.costs.observe_other(time.perf_counter() - started - verify_seconds - draft_seconds)
        return deltas

    def _backlog(self, request: Request, proposed: dict[str, Draft]) -> int:
        """What a costly drafter must catch up on before it drafts this row (0 for free drafts)."""
        backlog = getattr(self.drafters[request.drafter], "backlog", None)
        return 0 if request.id in proposed or backlog is None else backlog(request.id)

    def _observe_draft(self, name: str, source: str, tokens: int, seconds: float) -> None:
        """Price a costly drafter's draft tokens: by its own timing of one drafting pass where it
        keeps one (its catching up on rows it sat out is priced apart), else by the call's time."""
        drafter = self.drafters[name]
        per_pass = getattr(drafter, "last_pass_seconds", None)
        if per_pass is not None:
            self.policy.costs.observe_draft(source, 1, per_pass)
        elif tokens:
            self.policy.costs.observe_draft(source, tokens, seconds)
        self.policy.costs.observe_catch_up(source, *getattr(drafter, "last_catch_up", (0, 0.0)))

    def _propose(self, name: str, group: list[Request], lengths: list[int], deltas: list[Delta], method: str = "propose"):
        """One batched propose call (`method`: propose, or a two-part drafter's propose_free /
        propose_costly); a drafter that raises fails its own requests, not the others."""
        start = time.perf_counter()
        try:
            out = getattr(self.drafters[name], method)([r.id for r in group], lengths)
        except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its requests
            for request in group:
                deltas.append(self._fail(request, f"drafter {name!r} failed: {type(exc).__name__}: {exc}"))
            return time.perf_counter() - start, {}
        for request, draft, limit in zip(group, out, lengths):
            assert draft is None or len(draft) <= limit, (name, len(draft), limit)
        return time.perf_counter() - start, {r.id: d for r, d in zip(group, out)}

    def _verify(self, running: list[Request], drafts: dict[str, Draft], deltas: list[Delta]):
        while running:
            try:
                return self.verifier.step({r.id: r.last_token for r in running},
                                          {r.id: drafts[r.id] for r in running if len(drafts.get(r.id, EMPTY_DRAFT))})
            except InvalidDraftError as exc:  # the drafter's fault: that request fails, the others go on
                failed = self._running[exc.row_id]
                deltas.append(self._fail(failed, str(exc)))
                running = [r for r in running if r.id != exc.row_id]
        return {}

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
            request.finish_reason = "stop"
        if request.finish_reason is not None:
            text += request.detok.flush()
        else:
            request.last_token = kept[-1]
            self.drafters[request.drafter].accept(request.id, kept)
        return Delta(request.id, kept, text, request.finish_reason, accepted=accepted, drafted_text=drafted_text)

    def _fail(self, request: Request, error: str) -> Delta:
        request.finish_reason, request.error = "error", error
        self._retire(request)
        return Delta(request.id, [], request.detok.flush(), "error", error)

    def _retire(self, request: Request) -> None:
        request.metrics.finished = time.perf_counter()
        self.verifier.remove(request.id)
        if request.begun:
            self.drafters[request.drafter].end(request.id)
            self.policy.end(request.id)
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
        prompt = [int(t) % self.verifier.vocab_size for t in range(3, 35)]
        greedy = SamplingParams(max_tokens=4 * (self.k + 1) + 4)
        draft = Draft(np.asarray(prompt[: self.k], dtype=np.int32))
        for batch in sorted({1, self.max_batch}):
            ids = [f"__calibrate-{i}" for i in range(batch)]
            for row_id in ids:
                self.verifier.admit(row_id, prompt, greedy)
            drafting = {0, batch} if self.k else {0}  # how many rows draft k
            if self.k and self.verifier.packs:
                drafting.add(1)
            for rows in sorted(drafting):
                times = []
                for _ in range(4):  # the first call pays one-off allocation and kernel selection
                    start = time.perf_counter()
                    self.verifier.step({r: prompt[-1] for r in ids}, {r: draft for r in ids[:rows]})
                    times.append(time.perf_counter() - start)
                    for row_id in ids:
                        self.verifier.truncate(row_id, len(prompt))
                lengths = [self.k] * rows + [0] * (batch - rows)
                self.policy.costs.observe_verify(batch, self.policy.computed_tokens(lengths), float(np.median(times[1:])))
            for row_id in ids:
                self.verifier.remove(row_id)
        for name, drafter in self.drafters.items():
            if getattr(drafter, "cheap", False) or not self.k:
                continue
            two_parts = hasattr(drafter, "propose_costly")
            propose = drafter.propose_costly if two_parts else drafter.propose
            source = f"{name}/{drafter.costly_part}" if two_parts else name
            priced_apart = hasattr(drafter, "last_catch_up")  # else a first round's time holds its catch-up
            for request_id in ("__calibrate", "__calibrate-again"):  # the first request warms up
                drafter.begin(request_id, prompt, greedy)
                for round_ in range(4):  # the first round catches up on the prompt
                    start = time.perf_counter()
                    [draft] = propose([request_id], [self.k])
                    if len(draft) and request_id != "__calibrate" and (round_ or priced_apart):
                        self._observe_draft(name, source, len(draft), time.perf_counter() - start)
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
            request.metrics.to_dict(len(request.generated)),
            request.error,
        )
