"""The request loop: admits requests into the verifier's batch, asks the drafter for drafts, applies
stop rules (EOS, stop strings, max_tokens, context limit) and reports per-request metrics.

The engine is synchronous and single-threaded; the HTTP server runs it on its own thread.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from specdraft.drafters.base import Drafter
from specdraft.params import SamplingParams, check_num_speculative_tokens
from specdraft.text import IncrementalDetokenizer
from specdraft.verifier import InvalidDraftError, Verifier


class RequestError(ValueError):
    """A request the engine cannot serve as given (the message names the problem)."""


@dataclass
class RequestMetrics:
    k: int
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
            "steps": self.steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            "mean_accepted_length": self.accepted_tokens / self.steps if self.steps else 0.0,
            "per_position_acceptance": (self.accepted_at[: len(drafted)] / drafted).round(4).tolist(),
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
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    last_token: int | None = None
    error: str | None = None  # why the request failed (finish_reason "error")


@dataclass(frozen=True)
class Delta:
    """New output of one request after a step. `finish_reason` is set on its last delta."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None


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
    def __init__(
        self,
        verifier: Verifier,
        drafter: Drafter,
        tokenizer,
        eos_token_ids: Sequence[int],
        max_context: int,
        k: int = 5,
        max_batch: int = 8,
    ) -> None:
        check_num_speculative_tokens(k, "k")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.verifier, self.drafter, self.tokenizer = verifier, drafter, tokenizer
        self.eos = frozenset(eos_token_ids)
        self.max_context, self.k, self.max_batch = max_context, k, max_batch
        self._waiting: deque[Request] = deque()
        self._running: dict[str, Request] = {}
        self._ids = itertools.count()
        self._done: dict[str, Request] = {}  # finished requests not yet collected

    # -- submission ----------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None) -> str:
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise RequestError("prompt is empty: give at least one token")
        if len(prompt_ids) >= self.max_context:
            raise RequestError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_context}, leaving no room to generate"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        self._waiting.append(Request(request_id, prompt_ids, params, detok, RequestMetrics(self.k)))
        return request_id

    def cancel(self, request_id: str) -> None:
        self._waiting = deque(r for r in self._waiting if r.id != request_id)
        if request_id in self._running:
            self._retire(self._running[request_id])

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    # -- the loop ------------------------------------------------------------------------
    def step(self) -> list[Delta]:
        """Admit waiting requests (prefill), then one verify pass over all running rows.

        A request admitted in this step also takes part in its verify pass, so it may get two deltas.
        """
        deltas = []
        while self._waiting and len(self._running) < self.max_batch:
            deltas.append(self._admit(self._waiting.popleft()))
        self._retire_finished(deltas)
        if self._running:
            decoded = self._decode(list(self._running.values()))
            self._retire_finished(decoded)
            deltas.extend(decoded)
        return deltas

    def _retire_finished(self, deltas: list[Delta]) -> None:
        for delta in deltas:
            if delta.finish_reason is not None and delta.request_id in self._running:
                self._retire(self._running[delta.request_id])

    def _admit(self, request: Request) -> Delta:
        self.drafter.begin(request.id, request.prompt_ids, request.params)
        self._running[request.id] = request
        first = self.verifier.add(request.id, request.prompt_ids, request.params)
        request.metrics.first_token = time.perf_counter()
        return self._emit(request, [first])

    def _decode(self, running: list[Request]) -> list[Delta]:
        budgets = [self._remaining(r) - 1 for r in running]  # the step itself adds one token
        start = time.perf_counter()
        drafts = self.drafter.propose([r.id for r in running], [min(self.k, b) for b in budgets])
        draft_seconds = (time.perf_counter() - start) / len(running)
        for request, draft, budget in zip(running, drafts, budgets):
            assert len(draft) <= min(self.k, budget), (len(draft), budget)
        deltas = []
        while True:
            try:
                results = self.verifier.step(
                    {r.id: r.last_token for r in running}, {r.id: d for r, d in zip(running, drafts) if len(d)}
                )
                break
            except InvalidDraftError as exc:  # the drafter's fault: that request fails, the others go on
                b = next(i for i, r in enumerate(running) if r.id == exc.row_id)
                deltas.append(self._fail(running.pop(b), str(exc)))
                drafts.pop(b)
        for request, draft in zip(running, drafts):
            result = results[request.id]
            request.metrics.record(len(draft), result.accepted)
            request.metrics.draft_seconds += draft_seconds
            deltas.append(self._emit(request, result.tokens))
        return deltas

    def _remaining(self, request: Request) -> int:
        used = len(request.prompt_ids) + len(request.generated)
        return min(request.params.max_tokens - len(request.generated), self.max_context - used)

    def _emit(self, request: Request, tokens: list[int]) -> Delta:
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
        text, hit_stop = request.detok.add(kept)
        if hit_stop:
            request.finish_reason = "stop"
        if request.finish_reason is not None:
            text += request.detok.flush()
        else:
            request.last_token = kept[-1]
            self.drafter.accept(request.id, kept)
        return Delta(request.id, kept, text, request.finish_reason)

    def _fail(self, request: Request, error: str) -> Delta:
        request.finish_reason, request.error = "error", error
        self._retire(request)
        return Delta(request.id, [], request.detok.flush(), "error", error)

    def _retire(self, request: Request) -> None:
        request.metrics.finished = time.perf_counter()
        self.verifier.remove(request.id)
        self.drafter.end(request.id)
        del self._running[request.id]
        if request.finish_reason is None:
            request.finish_reason = "cancelled"
        self._done[request.id] = request

    # -- conveniences --------------------------------------------------------------------
    def run(self, requests: Iterable[tuple[Sequence[int], SamplingParams]]) -> list[Completion]:
        """Decode all requests together (continuous batching) and return them in order."""
        ids = [self.submit(prompt, params) for prompt, params in requests]
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
