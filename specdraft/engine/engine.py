"""`Engine`: the request loop. It admits requests (each from the longest prefix of its prompt that the
verifier's prefix cache holds), prefills the rest in chunks between decode steps, runs
each decode step's stages (`step.py`) over the running rows, then applies what the step returned:
each verified row's tokens under the stop rules (EOS, stop strings, max_tokens, the context), the
failures, the retirements (what a request committed is kept for later prompts); and tells the
policy what the step did, once.

Each request names its drafter, its longest draft and its policy (`SpeculationParams`; the engine
owns the defaults of all three); the engine holds the drafters, built and warmed once, by name, and
asks each only what the drafter contract declares (`specdraft.drafters.base`). The engine is
synchronous and single-threaded; a server runs it on one thread (`specdraft.service`).
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Iterable, Iterator, Mapping, Sequence

from specdraft.drafters.base import Drafter, Parts, drafter_failure, parts_of
from specdraft.engine import constrain
from specdraft.engine.calibrate import calibrate as calibrate_policy
from specdraft.engine.requests import Completion, Delta, EngineStats, GrammarMetrics, Phase, Request, RequestMetrics
from specdraft.engine.step import Stages
from specdraft.errors import RequestError
from specdraft.grammar import GrammarCompiler
from specdraft.params import (DEFAULT_MAX_BATCH, DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_POLICY, PREFILL_CHUNK, SamplingParams,
                              SpeculationParams, check_num_speculative_tokens, check_policy)
from specdraft.policy import DraftPolicy
from specdraft.text import IncrementalDetokenizer
from specdraft.verifier import StepResult, TokenLogprob, Verifier

log = logging.getLogger("specdraft.engine")


class Engine:
    """verifier: the target; drafters: prebuilt drafters by name (`default_drafter` serves requests
    that name none: the first by default); k: the longest draft a request may ask for (its default);
    policy: how requests that name none choose draft lengths (`auto`: the cost-aware policy;
    `fixed`: as long as the drafter goes, every step); calibrate: time a few verify steps and costly
    drafts at start so that the policy starts from measurements; prefill_budget: prompt tokens
    prefilled per step while other requests decode; grammar: compiles requests' response formats
    (None: requests with one are refused)."""

    def __init__(self, verifier: Verifier, drafters: Mapping[str, Drafter], tokenizer, eos_token_ids: Sequence[int],
                 max_context: int, k: int = DEFAULT_NUM_SPECULATIVE_TOKENS, max_batch: int = DEFAULT_MAX_BATCH,
                 default_drafter: str | None = None, policy: str = DEFAULT_POLICY, calibrate: bool = True,
                 prefill_budget: int = PREFILL_CHUNK, grammar: GrammarCompiler | None = None) -> None:
        check_num_speculative_tokens(k, "k")
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
        self.default_policy = check_policy(policy)
        self.eos = frozenset(eos_token_ids)
        self.max_context, self.k, self.max_batch, self.prefill_budget = max_context, k, max_batch, prefill_budget
        self.policy = DraftPolicy(k, packed=verifier.packs)
        self.stages = Stages(verifier, self.drafters, self.parts, max_context)
        # Every request from submission until it is collected, in submission order (rows are admitted
        # and prefilled in that order); each knows its phase.
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.prefill_seconds = 0.0  # time spent prefilling the target with prompts (the same whatever drafts)
        self._decoded = 0  # tokens the last decode step verified: the estimate of this step's (`_prefill_budget`)
        if calibrate:
            calibrate_policy(verifier, self.drafters, self.parts, self.policy, k, max_batch)

    # -- submission ----------------------------------------------------------------------
    def validate(self, prompt_ids: Sequence[int], speculation: SpeculationParams | None = None,
                 params: SamplingParams | None = None, prompt_param: str = "prompt") -> SpeculationParams:
        """The one intake check of a request, whoever submits it (library, server, CLI): raise
        RequestError if this engine cannot serve it (an empty prompt, a token id outside the vocabulary,
        a prompt that leaves no room in the context, a drafter or draft length it lacks; its response
        format, when `params` are given); return its speculation settings with the defaults filled in.
        `prompt_param`: the request field the prompt came from, as errors name it. Reads only the
        engine's fixed configuration and the grammar compiler (which locks): safe from any thread."""
        if not len(prompt_ids):
            raise RequestError("prompt is empty: give at least one token", param=prompt_param)
        vocab = self.verifier.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param=prompt_param)
        if len(prompt_ids) >= self.max_context:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; this model's context is {self.max_context} "
                               "tokens, leaving no room to generate", param=prompt_param, code="context_length_exceeded")
        if params is not None and params.response_format is not None:
            constrain.grammar_of(self.grammar, params, bool(self.eos))
        speculation = speculation or SpeculationParams()
        drafter = speculation.drafter or self.default_drafter
        if drafter not in self.drafters:
            raise RequestError(f"drafter {drafter!r} is not available here; choose one of: "
                               f"{', '.join(sorted(self.drafters))}", param="speculation")
        k = self.k if speculation.num_speculative_tokens is None else speculation.num_speculative_tokens
        if k > self.k:
            raise RequestError(f"num_speculative_tokens {k} is above this engine's maximum of {self.k}",
                               param="speculation")
        return SpeculationParams(drafter, k, speculation.policy or self.default_policy)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, speculation: SpeculationParams | None = None,
               request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        speculation = self.validate(prompt_ids, speculation)
        grammar = None if params.response_format is None else constrain.grammar_of(self.grammar, params, bool(self.eos))
        k, drafter = speculation.num_speculative_tokens, speculation.drafter
        request_id = request_id or f"req-{next(self._ids)}"
        metrics = RequestMetrics(k, drafter, grammar=None if grammar is None else GrammarMetrics())
        self._requests[request_id] = Request(request_id, prompt_ids, params, drafter, k, speculation.policy,
                                             IncrementalDetokenizer(self.tokenizer, params.stop), metrics,
                                             grammar=grammar, logprobs=None if params.logprobs is None else [])
        return request_id

    def cancel(self, request_id: str) -> None:
        """Stop a request now; its rows and drafter state are freed (it is collected as "cancelled")."""
        request = self._requests.get(request_id)
        if request is None or request.phase is Phase.DONE:
            return
        if request.phase is Phase.RUNNING:
            self._retire(request)
            return
        if request.phase is not Phase.WAITING:
            self.verifier.remove(request.id)
        request.phase, request.finish_reason = Phase.DONE, "cancelled"

    def request(self, request_id: str) -> Request:
        """The request as the engine holds it (its phase, its prefill's progress): to read, not to change."""
        return self._requests[request_id]

    def _in(self, *phases: Phase) -> Iterator[Request]:
        return (r for r in self._requests.values() if r.phase in phases)

    @property
    def has_work(self) -> bool:
        return any(r.phase is not Phase.DONE for r in self._requests.values())

    @property
    def running(self) -> int:
        return sum(1 for _ in self._in(Phase.RUNNING))

    @property
    def waiting(self) -> int:
        return sum(1 for _ in self._in(Phase.WAITING, Phase.ADMITTED, Phase.PREFILLING))

    def stats(self) -> EngineStats:
        return EngineStats(self.running, self.waiting, self.verifier.prefix_stats())

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> list[Delta]:
        """Admit waiting requests, prefill (`_prefill`), then one decode step over the running rows.
        A request whose prefill ends in this step also takes part in its decode step, so it may get
        two deltas."""
        rows = sum(1 for _ in self._in(Phase.ADMITTED, Phase.PREFILLING, Phase.RUNNING))
        for request in list(self._in(Phase.WAITING))[: max(0, self.max_batch - rows)]:
            self.verifier.add(request.id, request.params, request.grammar)
            request.phase = Phase.ADMITTED
        deltas = self._prefill(self._prefill_budget())
        if self.running:
            deltas += self._decode()
        return deltas

    def _prefill_budget(self) -> int | None:
        """Prompt tokens this step prefills (None: every admitted prompt whole, as no request decodes).
        A step's prompt tokens and the tokens its decode step verifies share one budget,
        `prefill_budget`: prefill takes what the decode step leaves, counted as what the last one
        verified (this step's drafts are chosen after prefill), and never less than a quarter of it (a
        waiting prompt always advances, however much the running rows draft)."""
        if not self.running:
            return None
        return max(self.prefill_budget - self._decoded, self.prefill_budget // 4)

    def _prefill(self, budget: int | None) -> list[Delta]:
        """Prefill admitted prompts in order, up to `budget` tokens (None: all of them). A prompt starts
        from the longest prefix of it that the verifier's prefix cache holds, looked up when its prefill
        begins (not at admission): requests admitted together that share a system prompt find it stored
        by the one prefilled before them."""
        deltas = []
        for request in list(self._in(Phase.ADMITTED, Phase.PREFILLING)):
            if budget is not None and budget <= 0:
                break
            if request.phase is Phase.ADMITTED:
                request.phase = Phase.PREFILLING
                request.prefilled = self.verifier.reuse(request.id, request.params.cache_salt, request.prompt_ids)
                request.metrics.cached_tokens = request.prefilled
            rest = len(request.prompt_ids) - request.prefilled
            take = rest if budget is None else min(rest, budget)
            started = time.perf_counter()
            first = self.verifier.prefill(request.id, request.prompt_ids[request.prefilled : request.prefilled + take],
                                          last=take == rest)
            self.prefill_seconds += time.perf_counter() - started
            request.prefilled += take
            if budget is not None:
                budget -= take
            if first is not None:
                self.verifier.keep(request.id, request.params.cache_salt, request.prompt_ids)
                deltas.append(self._retire_finished(self._begin(request, first)))
        return deltas

    def _begin(self, request: Request, first: StepResult) -> Delta:
        """A request whose prompt is prefilled joins the running rows with its first token."""
        if first.error is not None:
            return self._failed(request, first.error)
        try:
            self.drafters[request.drafter].begin(request.id, request.prompt_ids, request.params)
        except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its request
            return self._failed(request, drafter_failure(request.drafter, exc))
        self.policy.begin(request.id, request.drafter)
        request.phase = Phase.RUNNING
        request.metrics.first_token = time.perf_counter()
        if request.grammar is not None:
            request.metrics.grammar.seconds += first.grammar_seconds
        return self._emit(request, first.tokens, logprobs=first.logprobs)

    def _decode(self) -> list[Delta]:
        """One decode step (`Stages.run`), then what it returned applied: failures, then each verified
        row's tokens; the policy is told what the step did, and the requests that ended are retired."""
        step = self.stages.run([self._requests[r] for r in self.verifier.row_ids], self.policy)
        deltas = [self._failed(row.request, row.failure) for row in step.failed]
        for outcome in step.outcomes():
            request = outcome.request
            request.metrics.record(outcome.drafted, outcome.accepted)
            request.metrics.draft_seconds += outcome.draft_seconds
            if request.grammar is not None:
                request.metrics.grammar.seconds += outcome.grammar_seconds
                request.metrics.grammar.forced_draft_tokens += outcome.forced[0]
                request.metrics.grammar.forced_accepted_tokens += outcome.forced[1]
            deltas.append(self._emit(request, outcome.tokens, outcome.accepted, outcome.logprobs))
        report = step.report(time.perf_counter())
        self.policy.record(report)
        self._decoded = 0 if report.verify is None else sum(1 + n for n in report.verify.lengths)
        return [self._retire_finished(delta) for delta in deltas]

    # -- applying a step -------------------------------------------------------------------
    def _emit(self, request: Request, tokens: list[int], accepted: int = 0,
              logprobs: Sequence[TokenLogprob] | None = None) -> Delta:
        """The request's new tokens under its stop rules (the delta of one that ends says why), with
        their logprobs where it asked for them."""
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
        kept_logprobs = None if request.logprobs is None else list(logprobs[: len(kept)])
        if kept_logprobs is not None:
            request.logprobs.extend(kept_logprobs)
        request.metrics.generated = len(request.generated)
        if request.finish_reason is None and request.room(self.max_context) <= 0:
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
                request.error = drafter_failure(request.drafter, exc)
        if request.finish_reason is not None:
            text += request.detok.flush()
        return Delta(request.id, kept, text, request.finish_reason, request.error, accepted=accepted,
                     drafted_text=drafted_text, logprobs=kept_logprobs)

    def _failed(self, request: Request, error: str) -> Delta:
        request.finish_reason, request.error = "error", error
        return Delta(request.id, [], request.detok.flush(), "error", error,
                     logprobs=None if request.logprobs is None else [])

    def _retire_finished(self, delta: Delta) -> Delta:
        if delta.finish_reason is not None:
            self._retire(self._requests[delta.request_id])
        return delta

    def _retire(self, request: Request) -> None:
        request.metrics.finished = time.perf_counter()
        self.verifier.keep(request.id, request.params.cache_salt, request.prompt_ids + request.generated)
        self.verifier.remove(request.id)
        if request.phase is Phase.RUNNING:
            self.policy.end(request.id)
            try:
                self.drafters[request.drafter].end(request.id)
            except Exception:  # noqa: BLE001 - the request is over either way; its drafter's fault is logged
                log.exception("drafter %r failed to end request %s", request.drafter, request.id)
        request.phase = Phase.DONE
        if request.finish_reason is None:
            request.finish_reason = "cancelled"

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
        if self._requests[request_id].phase is not Phase.DONE:
            raise KeyError(f"request {request_id!r} has not finished")
        request = self._requests.pop(request_id)
        if request.grammar is not None:
            request.metrics.grammar.complete = constrain.complete(request)
        return Completion(request.id, request.detok.text, list(request.generated), list(request.prompt_ids),
                          request.finish_reason, request.metrics, request.error,
                          None if request.logprobs is None else list(request.logprobs))
