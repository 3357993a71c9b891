"""A request as intake resolves it (`ResolvedRequest`) and as the engine holds it (`Request`: what
intake resolved, and its progress), its figures (`RequestMetrics`: typed, until the API edge writes
them as JSON), what the engine publishes for metrics (`EngineStats`), and what it hands back: a
`Delta` per request and step, then one `Completion`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from specdraft.drafters.base import Drafter, Parts
from specdraft.grammar import RowGrammar
from specdraft.params import Policy, SamplingParams
from specdraft.text import IncrementalDetokenizer
from specdraft.results import PrefixStats, TokenLogprob


@dataclass(frozen=True)
class ResolvedRequest:
    """A request checked and resolved by `Intake.resolve`. `params.max_tokens` is its token limit (it
    fits in the context with the prompt); `drafter` the object that drafts for it (`drafter_name` is
    the name it is reported under), `parts` what that drafter declares; `k` its longest draft;
    `grammar` its response format's state (None: free text)."""

    id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    drafter_name: str
    drafter: Drafter
    parts: Parts
    k: int
    policy: Policy
    grammar: RowGrammar | None = None

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens


@dataclass
class GrammarMetrics:
    """A constrained request's grammar: whether its output is a whole JSON value (known once it
    ends), the seconds its masks, draft cuts and forced tokens took, and the verified tokens it
    forced after an accepted draft (how many, how many of them were accepted)."""

    complete: bool | None = None
    seconds: float = 0.0
    forced_draft_tokens: int = 0
    forced_accepted_tokens: int = 0


@dataclass
class RequestMetrics:
    """One request's figures, kept as it runs. `drafted_at[i]` / `accepted_at[i]`: how often a
    draft reached / was accepted at position i + 1."""

    k: int
    drafter: str = ""
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_at: np.ndarray = None  # [k]
    accepted_at: np.ndarray = None  # [k]
    draft_seconds: float = 0.0
    grammar: GrammarMetrics | None = None  # a request with a response format
    generated: int = 0  # tokens generated
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None

    def __post_init__(self) -> None:
        self.drafted_at = np.zeros(self.k, dtype=np.int64)
        self.accepted_at = np.zeros(self.k, dtype=np.int64)

    def record(self, drafted: int, accepted: int) -> None:
        """A verify step of a `drafted`-token draft, of which `accepted` tokens were accepted."""
        self.steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted_per_step.append(accepted)
        self.drafted_at[:drafted] += 1
        self.accepted_at[:accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.accepted_tokens / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """The share of drafts reaching each position that were accepted there (positions some draft reached)."""
        drafted = self.drafted_at[self.drafted_at > 0]
        return (self.accepted_at[: len(drafted)] / drafted).round(4).tolist()

    @property
    def seconds(self) -> float:
        return (self.finished or time.perf_counter()) - self.started

    @property
    def time_to_first_token(self) -> float | None:
        return self.first_token - self.started if self.first_token else None

    @property
    def tokens_per_second(self) -> float:
        elapsed = self.seconds
        return self.generated / elapsed if elapsed > 0 else 0.0


class Phase(Enum):
    """Where a request is: WAITING for a row; ADMITTED to one, its prefill not begun (the prefix cache
    is asked for its prompt when it begins); PREFILLING; RUNNING (it has its first token, and its
    drafter and the policy track it); DONE (finish_reason says why), until it is collected."""

    WAITING = "waiting"
    ADMITTED = "admitted"
    PREFILLING = "prefilling"
    RUNNING = "running"
    DONE = "done"


@dataclass
class Request:
    """A request as intake resolved it (`resolved`: its id, prompt, params, drafter and its parts, k,
    policy and grammar, read through below; `params.max_tokens` is its limit, which fits in the
    context), and its progress."""

    resolved: ResolvedRequest
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    last_token: int | None = None
    error: str | None = None  # why the request failed (finish_reason "error")
    phase: Phase = Phase.WAITING
    prefilled: int = 0  # prompt tokens in the target's cache
    stop_string: bool = False  # it ended on a stop string (its text is cut there)
    logprobs: list[TokenLogprob] | None = None  # one per generated token, where its params ask for them

    @classmethod
    def of(cls, resolved: ResolvedRequest, detok: IncrementalDetokenizer) -> Request:
        metrics = RequestMetrics(resolved.k, resolved.drafter_name,
                                 grammar=None if resolved.grammar is None else GrammarMetrics())
        return cls(resolved, detok, metrics, logprobs=None if resolved.params.logprobs is None else [])

    id = property(lambda self: self.resolved.id)
    prompt_ids = property(lambda self: self.resolved.prompt_ids)  # a tuple
    params = property(lambda self: self.resolved.params)
    drafter_name = property(lambda self: self.resolved.drafter_name)
    drafter = property(lambda self: self.resolved.drafter)
    parts = property(lambda self: self.resolved.parts)
    k = property(lambda self: self.resolved.k)  # longest draft per step
    policy = property(lambda self: self.resolved.policy)  # how each step's draft length is chosen
    grammar = property(lambda self: self.resolved.grammar)  # its response format's state (the verifier advances it)

    @property
    def room(self) -> int:
        """Tokens it may still generate: its limit (which intake fitted in the context with the prompt)."""
        return self.params.max_tokens - len(self.generated)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine, for metrics: rows decoding, requests waiting for a row or for their
    prefill, and the prefix cache's figures (None: it keeps none). The engine's thread makes one after
    each step and as requests come and go (`Engine.stats`); other threads read it, never the engine's
    live tables."""

    running: int
    waiting: int
    prefix_cache: PrefixStats | None = None


@dataclass(frozen=True)
class Delta:
    """New output of one request after a step. `finish_reason` is set on its last delta. `accepted`
    of `token_ids` came from the request's draft (they lead), the rest from the target itself;
    `drafted_text` is the part of `text` that the accepted draft tokens produced (a prefix of it);
    `logprobs`: one entry per token of `token_ids`, where the request asked for them."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None
    accepted: int = 0
    drafted_text: str = ""
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class Completion:
    """A finished request: finish_reason "stop" (an EOS token or a stop string), "length"
    (max_tokens or the model's context), "error" (`error` says why; `text` holds what came before)
    or "cancelled". metrics: the engine's figures for the request (`RequestMetrics`), among them steps,
    draft_tokens, accepted_tokens, acceptance_rate, mean_accepted_length and tokens_per_second.
    `logprobs`: one `TokenLogprob` per token of `token_ids`, where `SamplingParams.logprobs` asked for
    them (a stream's deltas carry their own tokens' entries). `LLM` returns these too."""

    request_id: str
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
