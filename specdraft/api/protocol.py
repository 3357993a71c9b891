"""The OpenAI-compatible wire format: request bodies (validated here, once, into `SamplingParams`
and `SpeculationParams`), response and stream-chunk bodies, and error bodies.

Fields follow OpenAI's completions and chat completions APIs; `top_k` and `speculation` are
extensions. Types are strict (a string is not a number). Unknown fields are refused rather than
ignored, and so are OpenAI fields this server does not implement (`echo`, `n` > 1, penalties,
tools, ...): an option is never silently dropped. Logprobs are the target's raw ones
(`specdraft.verifier.TokenLogprob`), whatever the request's temperature, top-k or top-p.
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterator, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specdraft.params import (MAX_LOGPROBS, MAX_SPECULATIVE_TOKENS, MAX_TEMPERATURE, POLICIES, ResponseFormat,
                              SamplingParams, SpeculationParams)
from specdraft.text import check_unicode

if TYPE_CHECKING:
    from specdraft.engine import Completion, RequestMetrics
    from specdraft.results import TokenLogprob

MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_COMPLETION_LOGPROBS = 5  # the legacy endpoint's `logprobs`, as OpenAI allows (chat's `top_logprobs`: MAX_LOGPROBS)
LOWEST_LOGPROB = -9999.0  # stands for -inf, which JSON cannot carry (as vLLM writes it)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Speculation(_Strict):
    """Extension: how this request speculates."""

    drafter: str | None = None  # default: the server's --drafter
    num_speculative_tokens: int | Literal["auto"] | None = Field(default=None)  # "auto"/None: the server's -k
    policy: Literal[POLICIES] | None = None  # how each step's draft length is chosen; default: the server's --policy
    annotate: bool = False  # stream chunks say which of their text came from accepted draft tokens

    @field_validator("num_speculative_tokens")
    @classmethod
    def _range(cls, value):
        if isinstance(value, int) and not 0 <= value <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"must be between 0 and {MAX_SPECULATIVE_TOKENS} or \"auto\", got {value}")
        return value


class JsonSchema(_Strict):
    """OpenAI's `response_format.json_schema`: a named JSON Schema. Output is always held to the
    schema (`strict` is accepted either way)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict | bool = Field(alias="schema")
    strict: bool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormatBody = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # extension; -1 or 0: off
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None  # accepted for compatibility; not used
    speculation: Speculation | None = None
    response_format: ResponseFormatBody | None = None  # JSON output; an extension on /v1/completions
    cache_salt: str | None = Field(default=None, min_length=1)  # as vLLM's: shares cached prompt entries only within a salt
    # OpenAI options this server does not implement: accepted only at their neutral values.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        """Every string of the body, keys too, is valid Unicode (JSON's "\\ud800" is not): refused before
        any field reads it, naming where (`specdraft.text.check_unicode`)."""
        for where, text in _strings(data, ""):
            check_unicode(text, where)
        return data

    @field_validator("n")
    @classmethod
    def _one(cls, value):
        if value != 1:
            raise ValueError(f"must be 1 (this server returns one choice per request), got {value}")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value):
        if value not in (None, 0, 0.0):
            raise ValueError("is not supported by this server (only 0)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise ValueError("is not supported by this server")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return value

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        """max_tokens None: what fits in the context with the prompt (the engine's intake resolves it)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        top_k = self.top_k if self.top_k and self.top_k > 0 else 0
        return SamplingParams(max_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_k=top_k, top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
                              stop=tuple(stops), response_format=self._response_format(), cache_salt=self.cache_salt,
                              logprobs=self.logprobs_count)

    def _response_format(self) -> ResponseFormat | None:
        given = self.response_format
        if isinstance(given, JsonSchemaFormat):
            return ResponseFormat.json_schema(given.json_schema.schema_)
        return ResponseFormat.json_object() if isinstance(given, JsonObjectFormat) else None

    def speculation_params(self) -> SpeculationParams:
        """The request's choices; what it leaves out (None) the engine fills in with its defaults."""
        spec = self.speculation or Speculation()
        k = spec.num_speculative_tokens
        return SpeculationParams(drafter=spec.drafter, num_speculative_tokens=None if k == "auto" else k, policy=spec.policy)

    @property
    def logprobs_count(self) -> int | None:
        """The most likely tokens to show at each position with each token's logprob (None: no logprobs)."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def annotate(self) -> bool:
        return bool(self.speculation and self.speculation.annotate)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = None

    @property
    def logprobs_count(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) != 1:
            raise ValueError(f"give one prompt per request, got {len(value)}")
        return value  # an empty one is the engine's to refuse (`Engine.resolve`), as every prompt is

    @field_validator("echo", "suffix", "best_of")
    @classmethod
    def _unsupported(cls, value, info):
        neutral = {"echo": False, "suffix": None, "best_of": None}[info.field_name]
        if value != neutral and not (info.field_name == "best_of" and value == 1):
            raise ValueError("is not supported by this server")
        return value


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list | None = None
    tool_choice: str | dict | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value, info):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs set to true")
        return value

    @field_validator("tools", "tool_choice")
    @classmethod
    def _unsupported(cls, value, info):
        if value not in (None, "none"):
            raise ValueError("is not supported by this server")
        return value

    @property
    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Each string in a parsed JSON value, keys included, with where it is ("messages[0].content")."""
    if isinstance(value, str):
        yield where or "the body", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, f"a key of {where or 'the body'}")
            yield from _strings(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (str, dict, list)):  # not one call per token id of a long prompt
                yield from _strings(item, f"{where}[{i}]")


# -- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, metrics: RequestMetrics) -> dict:
    """OpenAI's usage object, with the request's speculation statistics as an extension."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens},
        "speculation": {
            "drafter": metrics.drafter,
            "steps": metrics.steps,
            "draft_tokens": metrics.draft_tokens,
            "accepted_tokens": metrics.accepted_tokens,
            "acceptance_rate": round(metrics.acceptance_rate, 4),
            "mean_accepted_length": round(metrics.mean_accepted_length, 4),
        },
    }


def metrics_json(metrics: RequestMetrics) -> dict:
    """A request's figures as JSON (the CLI's `--json`, the benchmarks' per-prompt rows)."""
    grammar = metrics.grammar
    out = {
        "drafter": metrics.drafter,
        "steps": metrics.steps,
        "draft_tokens": metrics.draft_tokens,
        "accepted_tokens": metrics.accepted_tokens,
        "acceptance_rate": metrics.acceptance_rate,
        "mean_accepted_length": metrics.mean_accepted_length,
        "per_position_acceptance": metrics.per_position_acceptance,
        "drafted_at": metrics.drafted_at.tolist(),
        "accepted_at": metrics.accepted_at.tolist(),
        "accepted_per_step": list(metrics.accepted_per_step),
        "draft_seconds": metrics.draft_seconds,
        "seconds": metrics.seconds,
        "time_to_first_token": metrics.time_to_first_token,
        "tokens_per_second": metrics.tokens_per_second,
        "cached_tokens": metrics.cached_tokens,
    }
    if grammar is not None:
        out["grammar"] = {"complete": grammar.complete, "seconds": grammar.seconds,
                          "forced_draft_tokens": grammar.forced_draft_tokens,
                          "forced_accepted_tokens": grammar.forced_accepted_tokens}
    return out


def completion_json(completion: Completion) -> dict:
    """A finished request as JSON: its text, token ids, finish reason, figures (and error)."""
    out = {"text": completion.text, "token_ids": completion.token_ids, "prompt_token_ids": completion.prompt_token_ids,
           "finish_reason": completion.finish_reason, "metrics": metrics_json(completion.metrics)}
    if completion.error is not None:
        out["error"] = completion.error
    return out


def structured_output(metrics: RequestMetrics, finish_reason: str) -> dict | None:
    """Extension of a choice with a response format: whether its JSON is complete, and if not why."""
    grammar = metrics.grammar
    if grammar is None:
        return None
    if grammar.complete:
        return {"complete": True}
    why = "max_tokens ran out" if finish_reason == "length" else f"generation ended ({finish_reason})"
    return {"complete": False, "message": f"{why} before the JSON was complete: the text does not parse"}


def chat_logprobs(entries: Sequence[TokenLogprob], text_of: Callable[[int], str]) -> dict:
    """OpenAI's chat `choices[].logprobs`: each token's text, logprob and UTF-8 bytes, and its
    position's most likely tokens alike. text_of: a token id's text."""
    def one(token: int, logprob: float) -> dict:
        text = text_of(token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]}


def completion_logprobs(entries: Sequence[TokenLogprob], text_of: Callable[[int], str], offset: int = 0) -> dict:
    """OpenAI's legacy `choices[].logprobs`: the tokens' texts and logprobs, each position's most likely
    tokens as {text: logprob}, and each token's offset in the generated text (its tokens' texts laid
    end to end, from `offset`: the length of what earlier chunks of a stream carried)."""
    texts = [text_of(e.token) for e in entries]
    offsets = list(itertools.accumulate((len(t) for t in texts[:-1]), initial=offset))[: len(texts)]
    return {"tokens": texts, "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{text_of(t): _finite(lp) for t, lp in e.top} for e in entries], "text_offset": offsets}


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOWEST_LOGPROB


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def created() -> int:
    return int(time.time())
