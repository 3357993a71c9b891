"""`Engine`: the request loop. It takes requests as intake resolved them (`specdraft.engine.intake`:
checked once, with their limit, grammar and drafter object), admits them (each from the longest
prefix of its prompt that the verifier's prefix cache holds), and spends one token budget a step: the
running rows' decode step first (`step.py`: their last tokens and this step's chosen drafts), then
prefill, in chunks at fixed positions, with what is left. It applies what the step returned: each
verified row's tokens under the stop rules (EOS, stop strings, its limit), the failures, the
retirements (what a request committed is kept for later prompts); and tells the policy what the step
did, once. After each step, and as requests come and go, it publishes a frozen `EngineStats` that
other threads read in place of its live tables.

The engine holds the drafters, built and warmed once, and asks each only what the drafter contract
declares (`specdraft.drafters.base`). The engine is synchronous and single-threaded; a server runs it
on one thread (`specdraft.service`).
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, Iterator, Mapping, Sequence

from specdraft.drafters.base import Drafter, Parts, drafter_failure, parts_of
from specdraft.engine import constrain
from specdraft.engine.calibrate import KeptCalibration, calibrate as calibrate_policy
from specdraft.engine.intake import Intake, ResolvedRequest
from specdraft.engine.requests import Completion, Delta, EngineStats, Phase, Request
from specdraft.engine.step import Stages
from specdraft.grammar import GrammarCompiler
from specdraft.params import (DEFAULT_MAX_BATCH, DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_POLICY, DEFAULT_TOKEN_BUDGET,
                              SamplingParams, SpeculationParams, check_num_speculative_tokens, check_policy)
from specdraft.policy import DraftPolicy
from specdraft.results import TokenLogprob
from specdraft.text import IncrementalDetokenizer
from specdraft.verifier import Verdict, Verifier

log = logging.getLogger("specdraft.engine")


class Engine:
    """verifier: the target; drafters: prebuilt drafters by name (`default_drafter` serves requests
    that name none: the first by default); k: the longest draft a request may ask for (its default);
    policy: how requests that name none choose draft lengths (`auto`: the cost-aware policy;
    `fixed`: as long as the drafter goes, every step); calibrate: time a few verify steps and costly
    drafts at start so that the policy starts from measurements, or replay those `calibration` kept
    (`KeptCalibration`: measured and kept there where it holds none); token_budget: the tokens a step
    takes, the running rows' (drafts included) first, prefill what is left (`_prefill`); grammar:
    compiles requests' response formats (None: requests with one are refused)."""

    def __init__(self, verifier: Verifier, drafters: Mapping[str, Drafter], tokenizer, eos_token_ids: Sequence[int],
                 max_context: int, k: int = DEFAULT_NUM_SPECULATIVE_TOKENS, max_batch: int = DEFAULT_MAX_BATCH,
                 default_drafter: str | None = None, policy: str = DEFAULT_POLICY, calibrate: bool = True,
                 token_budget: int = DEFAULT_TOKEN_BUDGET, grammar: GrammarCompiler | None = None,
                 calibration: KeptCalibration | None = None) -> None:
        check_num_speculative_tokens(k, "k")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
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
        self.max_context, self.k, self.max_batch, self.token_budget = max_context, k, max_batch, token_budget
        self.intake = Intake(verifier.vocab_size, max_context, self.drafters, self.parts, self.default_drafter, k,
                             self.default_policy, grammar, bool(self.eos))
        self.policy = DraftPolicy(k, packed=verifier.packs)
        self.stages = Stages(verifier)
        # Every request from submission until it is collected, in submission order (rows are admitted
        # and prefilled in that order); each knows its phase. The engine's thread alone reads it.
        self._requests: dict[str, Request] = {}
        self.prefill_seconds = 0.0  # time spent prefilling the target with prompts (the same whatever drafts)
        self.stats = EngineStats(0, 0, verifier.prefix_stats())  # published by `_publish`: any thread reads it
        # How the policy learnt this machine's costs at start: "measured", "kept" (replayed), or "none".
        self.calibration = "none"
        if calibrate:
            measured = calibrate_policy(verifier, self.drafters, self.parts, self.policy, k, max_batch, calibration)
            self.calibration = "measured" if measured else "kept"

    # -- submission ----------------------------------------------------------------------
    def resolve(self, prompt_ids: Sequence[int], params: SamplingParams, speculation: SpeculationParams | None = None,
                prompt_param: str = "prompt") -> ResolvedRequest:
        """The one check of a request, whoever submits it (library, server, CLI): the request resolved
        (`Intake.resolve`), or RequestError naming what this engine cannot serve. Safe from any thread."""
        return self.intake.resolve(prompt_ids, params, speculation, prompt_param)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams,
               speculation: SpeculationParams | None = None) -> str:
        """`resolve` the request and `enqueue` it; return its id."""
        return self.enqueue(self.resolve(prompt_ids, params, speculation))

    def enqueue(self, request: ResolvedRequest) -> str:
        """Take a resolved request as it is (it waits for a row); return its id."""
        assert request.id not in self._requests, f"request {request.id!r} enqueued twice"
        self._requests[request.id] = Request.of(request, IncrementalDetokenizer(self.tokenizer, request.params.stop))
        self._publish()
        return request.id

    def cancel(self, request_id: str) -> None:
        """Stop a request now; its rows and drafter state are freed (it is collected as "cancelled")."""
        request = self._requests.get(request_id)
        if request is None or request.phase is Phase.DONE:
            return
        if request.phase is Phase.RUNNING:
            self._retire(request)
        else:
            if request.phase is not Phase.WAITING:
                self.verifier.remove(request.id)
            request.phase, request.finish_reason = Phase.DONE, "cancelled"
        self._publish()

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

    def _publish(self) -> None:
        """A frozen snapshot of the engine for metrics (`stats`), made on the engine's thread: readers
        on other threads take the reference, never iterate the live tables."""
        self.stats = EngineStats(self.running, self.waiting, self.verifier.prefix_stats())

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> list[Delta]:
        """Admit waiting requests, run one decode step over the running rows, then prefill with what
        the step's token budget has left (`_prefill`). A request whose prefill ends in this step gets
        its first token now and joins the next step's decode."""
        rows = sum(1 for _ in self._in(Phase.ADMITTED, Phase.PREFILLING, Phase.RUNNING))
        for request in list(self._in(Phase.WAITING))[: max(0, self.max_batch - rows)]:
            self.verifier.add(request.id, request.params, request.grammar)
            request.phase = Phase.ADMITTED
        deltas, budget = [], self.token_budget
        if self.running:
            deltas, verified = self._decode()
            budget -= verified
        deltas += self._prefill(budget)
        self._publish()
        return deltas

    def _prefill(self, budget: int) -> list[Delta]:
        """Prefill admitted prompts with `budget` tokens, whether or not rows decode, a chunk a prompt a
        round, the prompts with the fewest tokens left first: a long prompt is a job of many steps, and
        a short prompt that comes after it goes before its next chunk, so a short request waits for a
        chunk, not for the long prompt's whole prefill. A prompt is fed in chunks at fixed positions
        (`Verifier.chunk_end`): the budget decides only how many chunks run, so a prompt's passes, and
        its output, never depend on what other rows drafted. A chunk counts as its share of a whole
        chunk's work (`chunk_cost`: deep in a long prompt, chunks are shorter and count more a token). A
        chunk runs while it fits in what is left, and the step's first chunk always runs (a waiting
        prompt advances however much the running rows verify). A prompt starts from the longest prefix
        of it that the verifier's prefix cache holds, looked up when its prefill begins (not at
        admission); one whose first chunk is the first chunk of a prompt still being prefilled waits for
        that one to finish and store it (`_shares_a_prefill`), so requests admitted together that share
        a system prompt prefill it once."""
        deltas, spent, progress = [], 0, True
        while progress:
            progress = False
            for request in sorted(self._in(Phase.ADMITTED, Phase.PREFILLING),
                                  key=lambda r: len(r.prompt_ids) - r.prefilled):
                if request.phase is Phase.ADMITTED:
                    if self._shares_a_prefill(request):
                        continue
                    request.phase = Phase.PREFILLING
                    request.prefilled = self.verifier.read_prefix(request.id, request.params.cache_salt,
                                                                  request.prompt_ids)
                    request.metrics.cached_tokens = request.prefilled
                end = self.verifier.chunk_end(request.id, len(request.prompt_ids))
                cost = self.verifier.chunk_cost(request.id, end)
                if spent and spent + cost > budget:
                    continue
                spent += cost
                progress = True
                delta = self._prefill_chunk(request, end)
                if delta is not None:
                    deltas.append(delta)
        return deltas

    def _shares_a_prefill(self, request: Request) -> bool:
        """Whether a prompt still being prefilled begins with the same chunk as `request`'s (whose prefix
        the cache will hold once that prompt is prefilled)."""
        head = request.prompt_ids[: self.verifier.chunk_end(request.id, len(request.prompt_ids))]
        return any(other.prompt_ids[: len(head)] == head and len(other.prompt_ids) > len(head)
                   for other in self._in(Phase.PREFILLING))

    def _prefill_chunk(self, request: Request, end: int) -> Delta | None:
        """Feed the request's prompt up to `end`; where that ends the prompt, the request begins (its delta)."""
        started = time.perf_counter()
        last = end == len(request.prompt_ids)
        first = self.verifier.prefill(request.id, request.prompt_ids[request.prefilled : end], last=last)
        self.prefill_seconds += time.perf_counter() - started
        request.prefilled = end
        if first is None:
            return None
        self.verifier.store_prefix(request.id, request.params.cache_salt, request.prompt_ids)
        return self._retire_finished(self._begin(request, first))

    def _begin(self, request: Request, first: Verdict) -> Delta:
        """A request whose prompt is prefilled joins the running rows with its first token (`first`: the
        verdict of its prefill, one row)."""
        if first.errors[0] is not None:
            return self._failed(request, first.errors[0])
        try:
            request.drafter.begin(request.id, request.prompt_ids, request.params)
        except Exception as exc:  # noqa: BLE001 - the drafter's fault, reported on its request
            return self._failed(request, drafter_failure(request.drafter_name, exc))
        self.policy.begin(request.id, request.drafter_name)
        request.phase = Phase.RUNNING
        request.metrics.first_token = time.perf_counter()
        if request.grammar is not None:
            request.metrics.grammar.seconds += float(first.grammar_seconds[0])
        return self._emit(request, first.emitted(0), logprobs=first.logprobs[0])

    def _decode(self) -> tuple[list[Delta], int]:
        """One decode step (`Stages.run`), then what it returned applied: failures, then each verified
        row's tokens; the policy is told what the step did, and the requests that ended are retired.
        Also returns the tokens the step's verify pass took (its share of the token budget)."""
        step = self.stages.run([self._requests[r] for r in self.verifier.row_ids], self.policy)
        deltas = [self._failed(row.request, row.failure) for row in step.failed]
        for row in step.emitting:
            request = row.request
            request.metrics.record(row.drafted, row.accepted)
            request.metrics.draft_seconds += step.draft_share
            if request.grammar is not None:
                request.metrics.grammar.seconds += row.grammar_seconds
                request.metrics.grammar.forced_draft_tokens += row.forced[0]
                request.metrics.grammar.forced_accepted_tokens += row.forced[1]
            deltas.append(self._emit(request, row.tokens, row.accepted, row.logprobs))
        self.policy.record(step.report(time.perf_counter()))
        return [self._retire_finished(delta) for delta in deltas], step.tokens

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
                request.drafter.accept(request.id, kept)
            except Exception as exc:  # noqa: BLE001 - the drafter's fault: its request ends, with what it has
                request.finish_reason = "error"
                request.error = drafter_failure(request.drafter_name, exc)
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
        self.verifier.store_prefix(request.id, request.params.cache_salt, [*request.prompt_ids, *request.generated])
        self.verifier.remove(request.id)
        if request.phase is Phase.RUNNING:
            self.policy.end(request.id, len(request.generated), request.finish_reason == "stop")
            try:
                request.drafter.end(request.id)
            except Exception:  # noqa: BLE001 - the request is over either way; its drafter's fault is logged
                log.exception("drafter %r failed to end request %s", request.drafter_name, request.id)
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
        self._publish()
        if request.grammar is not None:
            request.metrics.grammar.complete = constrain.complete(request)
        return Completion(request.id, request.detok.text, list(request.generated), list(request.prompt_ids),
                          request.finish_reason, request.metrics, request.error,
                          None if request.logprobs is None else list(request.logprobs))
