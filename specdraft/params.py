"""Per-request options, validated once where a request enters (CLI, HTTP server, library call) and
trusted everywhere after: how it samples and stops (`SamplingParams`) and how it speculates
(`SpeculationParams`). Every check raises ValueError with a message that names the bad value. Also
the one owner of the engine's and the server's defaults (a module light enough for the CLI's parser)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Mapping

MAX_SPECULATIVE_TOKENS = 64  # the longest draft any request may ask for
DEFAULT_NUM_SPECULATIVE_TOKENS = 5  # an engine's longest draft, unless it is given one


class Policy(StrEnum):
    """How a request's draft length is chosen each step: AUTO lets the cost-aware policy
    (`specdraft.policy`) pick it from measured costs and acceptance (0 included); FIXED drafts as far
    as the drafter goes, up to k, every step (vLLM's behaviour: measures a drafter as it is)."""

    AUTO = "auto"
    FIXED = "fixed"


POLICIES = tuple(policy.value for policy in Policy)  # as requests, flags and options spell them
DEFAULT_POLICY = Policy.AUTO
PREFILL_CHUNK = 512  # the most prompt tokens a prefill pass takes (`RowModel.prefill_chunk`, at fixed positions)
# Rows an engine decodes together, unless it is given a number: a server's concurrent requests (the
# cost-aware policy lets rows with weak drafts decode plainly beside those that draft).
DEFAULT_MAX_BATCH = 16
# Tokens an engine step takes, unless it is given a number: the running rows' (their drafts included)
# first, prefill what is left; by default a whole prefill chunk beside a default batch's longest drafts.
DEFAULT_TOKEN_BUDGET = PREFILL_CHUNK + DEFAULT_MAX_BATCH * (DEFAULT_NUM_SPECULATIVE_TOKENS + 1)
DEFAULT_MAX_QUEUED = 64  # requests that may wait for a row in a server, unless it is given a number
DEFAULT_SAVE_EVERY = 300  # seconds between a server's saves of what its drafters keep (the n-gram memory)
# MiB of earlier requests' keys and values an engine keeps for prompts that start alike (0: none; see
# `specdraft.backend.prefix`): the embedded model's entries take 45 KiB a token in float32, so 1 GiB
# holds ~23k tokens, a few agent conversations' histories.
DEFAULT_PREFIX_CACHE_MB = 1024
MAX_LOGPROBS = 20  # the most likely tokens a request may ask to see at each position, as OpenAI allows
MAX_TEMPERATURE = 2.0  # the highest temperature a request may ask for (server, CLI, library), as OpenAI allows
DTYPES = ("auto", "float32", "bfloat16", "float16")  # a model's dtype (auto: float32 on CPU, bfloat16 on CUDA)
WEIGHTS = ("auto", "native", "dense")  # how a GGUF model's layers are read (`models.plan_load`)
ARITHMETIC = ("auto", "int8", "float32")  # what native weights compute in (`models.plan_load`)


def cache_dir() -> Path:
    """Where specdraft keeps what it makes once per machine (converted models, compiled kernels, the
    n-gram memory): `SPECDRAFT_CACHE_DIR`, default `~/.cache/specdraft`."""
    return Path(os.environ.get("SPECDRAFT_CACHE_DIR", Path.home() / ".cache" / "specdraft"))


def check_num_speculative_tokens(k: object, name: str = "num_speculative_tokens") -> int:
    """The one check of a draft length: an integer in 0..MAX_SPECULATIVE_TOKENS (0 = plain decoding)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"{name} must be an integer, got {k!r}")
    if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"{name} must be between 0 and {MAX_SPECULATIVE_TOKENS}, got {k}")
    return k


RESPONSE_FORMATS = ("json_object", "json_schema")


@dataclass(frozen=True)
class ResponseFormat:
    """What a request's output must be, as OpenAI's `response_format` says it: `json_object` (any JSON
    object) or `json_schema` (JSON valid under `schema`). Decoding is constrained to it
    (`specdraft.grammar`); whether a schema compiles is checked where the request enters the engine.

    `schema` is kept as JSON text (a frozen value); `ResponseFormat.json_schema(...)` takes a dict.
    """

    type: str = "json_object"
    schema: str | None = None  # JSON text of the schema (json_schema only)

    def __post_init__(self) -> None:
        if self.type not in RESPONSE_FORMATS:
            raise ValueError(f"response_format type must be one of {', '.join(RESPONSE_FORMATS)}, got {self.type!r}")
        if (self.type == "json_schema") != (self.schema is not None):
            raise ValueError("response_format: json_schema needs a schema, and only json_schema takes one")
        if self.schema is not None:
            try:
                schema = json.loads(self.schema)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"response_format: the schema is not JSON text: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"response_format: a JSON schema is an object (or true/false), got {type(schema).__name__}")

    @classmethod
    def json_object(cls) -> ResponseFormat:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str) -> ResponseFormat:
        """schema: a dict (or JSON text) in JSON Schema."""
        if isinstance(schema, str):
            return cls("json_schema", schema)
        try:
            return cls("json_schema", json.dumps(schema))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"response_format: the schema cannot be written as JSON: {exc}") from None


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens and when it stops.

    temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 disable those filters. A seed fixes
    the request's random draws (see `specdraft.sampling`); without one, each request draws its own.
    `response_format` constrains the output to JSON (`ResponseFormat`; None: free text).
    `cache_salt` changes no token: requests share cached prompt entries (`specdraft.backend.prefix`)
    only with requests of the same salt (None is a salt too: the default one).
    `logprobs` n: each output token comes with its log-probability under the target and the n most
    likely tokens at its position (`specdraft.results.TokenLogprob`; None: none, at no cost).
    `max_tokens` None: what fits in the context with the prompt; a number that does not fit is
    refused where the request enters (`specdraft.engine.intake`), as OpenAI refuses it.
    """

    max_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    response_format: ResponseFormat | None = None
    cache_salt: str | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.response_format is not None and not isinstance(self.response_format, ResponseFormat):
            raise ValueError(f"response_format must be a ResponseFormat, got {type(self.response_format).__name__}")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string, got {self.cache_salt!r}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer between 0 and {MAX_LOGPROBS} (or None), "
                             f"got {self.logprobs!r}")
        if self.response_format is not None and self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with response_format: a constrained output ends where its JSON does")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_cache_mb(value: object, name: str = "prefix_cache_mb") -> int:
    """The one check of a prefix cache's size in MiB: an integer >= 0 (0 keeps nothing)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r} (0 turns the prefix cache off)")
    return value


def check_policy(policy: object, name: str = "policy") -> Policy:
    if policy not in POLICIES:
        raise ValueError(f"{name} must be one of {', '.join(POLICIES)}, got {policy!r}")
    return Policy(policy)


@dataclass(frozen=True)
class SpeculationParams:
    """Which drafter proposes a request's tokens, its longest draft per step, and how each step's
    draft length is chosen (`POLICIES`).

    None means the engine's default for each: its default drafter, its k, its policy. Whether the
    named drafter exists and k is within the engine's maximum are checked where the request enters
    the engine that serves it (`specdraft.engine.intake`), which resolves the defaults.
    """

    drafter: str | None = None
    num_speculative_tokens: int | None = None
    policy: Policy | None = None  # given as a `Policy` or its name

    def __post_init__(self) -> None:
        if self.drafter is not None and (not isinstance(self.drafter, str) or not self.drafter):
            raise ValueError(f"drafter must be a non-empty name, got {self.drafter!r}")
        if self.num_speculative_tokens is not None:
            check_num_speculative_tokens(self.num_speculative_tokens)
        if self.policy is not None:
            object.__setattr__(self, "policy", check_policy(self.policy))
