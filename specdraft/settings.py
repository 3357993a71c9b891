"""How an engine is built: `Settings`, every option documented, checked and given its default here,
once. The library (`LLM(model, settings)` or `LLM(model, **options)`), the CLI (`specdraft
generate|serve`, whose flags default to these fields' defaults) and the benchmarks each make one and
hand it to `build_runtime`, which builds what `Settings.resolve` decides (`Resolved`: each drafter's
options, the model's device, dtype, weights and arithmetic) and decides nothing itself. What one
request chooses is not here (`SamplingParams`, `SpeculationParams`); the server's own options (host,
queue) are the CLI's."""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from specdraft.drafters import DEFAULT_DRAFTER, check_options, drafter_names, drafter_parts, is_builtin, uses
from specdraft.params import (ARITHMETIC, DEFAULT_MAX_BATCH, DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_POLICY,
                              DEFAULT_PREFIX_CACHE_MB, DTYPES, WEIGHTS, Policy, check_cache_mb,
                              check_num_speculative_tokens, check_policy)

if TYPE_CHECKING:
    from specdraft.models import DraftPlan, LoadedModel, Loading

log = logging.getLogger("specdraft")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")  # where a model may run

# What an engine for one request changes (`specdraft generate`): one row, and no prefix cache, since
# nothing could reuse what it computed.
ONE_REQUEST = MappingProxyType({"max_batch": 1, "prefix_cache_mb": 0})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """An engine's options, checked as they are made: a bad one raises ValueError naming it.
    `LLM(model, k=4)` and `Settings(k=4)` take the same names."""

    # The drafter a request gets when it names none (default: the first of `drafters`, else the
    # registry's `DEFAULT_DRAFTER`): a built-in drafter or an installed plugin (`specdraft drafters`).
    drafter: str | None = None
    # Every drafter requests may choose (`drafter` is among them), each built once at start.
    drafters: Sequence[str] | None = None
    # The longest draft a step verifies, 0..64 (0: plain decoding); a request may ask for less.
    k: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    # Rows (requests) decoded together; beyond them requests wait (a server queues them).
    max_batch: int = DEFAULT_MAX_BATCH
    # The context length served, prompt and output together: at most the model's (None: the model's).
    max_context: int | None = None
    # How a request's draft length is chosen each step, unless it says: `auto` (the cost-aware policy,
    # which drafts only where it pays) or `fixed` (as far as the drafter goes, up to k, every step).
    policy: Policy = DEFAULT_POLICY  # given as a `Policy` or its name
    # Each drafter's options by drafter name, `{"ngram": {"max_n": 4}}`: a name must be among the drafters
    # or a part of one (a composite's part takes the options of the drafter it is, unless the composite
    # names its own under the part's name).
    drafter_options: Mapping[str, Mapping[str, Any]] | None = None
    # The `model` drafter's draft model (and so that of every drafter built on it, `hybrid`): a name,
    # directory or .gguf sharing the target's vocabulary, or a `LoadedModel` (default: self-int8, an int8
    # copy of the target). Planned and loaded as the target is (`resolve`): on the target's device, with
    # `dtype`, `weights`, `arithmetic` and `enforce_eager`. Refused where no drafter uses it.
    draft_model: str | LoadedModel | None = None
    # Where the model runs: "cpu", "cuda" or "cuda:N" (default: cuda when present).
    device: str | None = None
    # The weights' and activations' dtype (`DTYPES`): auto is float32 on CPU and bfloat16 on CUDA.
    dtype: str = "auto"
    # A GGUF model's quantised layers (the kinds of `native.KINDS`) read as the file's blocks ("native") or as a float32 copy ("dense"),
    # same logits; "auto" takes native where it applies, and dense with `enforce_eager` (eager layers
    # would dequantise every block at every pass).
    weights: str = "auto"
    # What native weights compute in (`ARITHMETIC`): "int8" quantises each token's activations per
    # block as llama.cpp does for the weight's kind and multiplies them by the blocks' integers (fast;
    # its own output: benchmarks/results/cpu/int8/quality.md), "float32" is the dense model's arithmetic, bitwise (Hugging Face parity);
    # "auto" is int8 where native weights load, float32 otherwise. Either way speculation is lossless.
    arithmetic: str = "auto"
    # Steps run eagerly: no CUDA graphs on CUDA, no compiled step on CPU.
    enforce_eager: bool = False
    # Measure the drafters' and the target's costs at start, for the `auto` policy. What was measured is
    # kept (the cache dir's `calibration/`, under a key naming the machine, the models, these settings
    # and the code) and replayed at the next start with the same key, unless `recalibrate`.
    calibrate: bool = True
    recalibrate: bool = False
    # MiB of earlier requests' keys and values kept for later prompts that start alike (0: none).
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB

    def __post_init__(self) -> None:
        if self.drafter is not None and not isinstance(self.drafter, str):
            raise ValueError(f"drafter must be a drafter's name, got {self.drafter!r}")
        if self.drafters is not None and (isinstance(self.drafters, str) or not isinstance(self.drafters, Sequence)):
            raise ValueError(f"drafters must be a list of drafter names, got {self.drafters!r}")
        unknown = [name for name in self.served if name not in drafter_names()]
        if unknown:
            raise ValueError(f"unknown drafter {unknown[0]!r}; choose one of: {', '.join(drafter_names())}")
        check_num_speculative_tokens(self.k, "k")
        _check_positive("max_batch", self.max_batch)
        if self.max_context is not None:
            _check_positive("max_context", self.max_context)
        object.__setattr__(self, "policy", check_policy(self.policy))
        self._check_drafter_options()
        if self.draft_model is not None and not any(uses(name, "model") for name in self.served):
            raise ValueError(f"a draft model is used by the model and hybrid drafters (and any built on model), not by "
                             f"{', '.join(map(repr, self.served))}")
        if self.device is not None and not DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"device must be cpu or cuda (cuda:N for the Nth GPU), got {self.device!r}")
        for name, value, choices in (("dtype", self.dtype, DTYPES), ("weights", self.weights, WEIGHTS),
                                     ("arithmetic", self.arithmetic, ARITHMETIC)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if self.arithmetic == "int8" and (self.weights == "dense" or self.enforce_eager):
            raise ValueError("arithmetic int8 computes on native weights in the compiled CPU step, not with "
                             + ("weights dense" if self.weights == "dense" else "enforce_eager"))
        for name in ("enforce_eager", "calibrate", "recalibrate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_cache_mb(self.prefix_cache_mb)

    def _check_drafter_options(self) -> None:
        """Each key names a drafter being built or one it is built on, and each drafter takes every
        option given it: refused by name before anything loads, plugins' too."""
        given = self.drafter_options or {}
        if not isinstance(given, Mapping):
            raise ValueError(f"drafter_options must map drafter names to their options, got {given!r}")
        names = self.served
        stray = sorted(set(given) - set(names) - {part for name in names for part in built_on(name)})
        if stray:
            raise ValueError(f"drafter options name {stray[0]!r}, which is not among the drafters: {', '.join(names)}")
        for name, options in given.items():
            if not isinstance(options, Mapping):
                raise ValueError(f"the options of drafter {name!r} must be an object of option names, got {options!r}")
            check_options(name, options)

    @property
    def served(self) -> list[str]:
        """Every drafter built, the default first."""
        return list(dict.fromkeys([*([self.drafter] if self.drafter else []), *(self.drafters or [])])) or [DEFAULT_DRAFTER]

    @property
    def default_drafter(self) -> str:
        return self.served[0]

    def resolve(self, model: str | LoadedModel | None = None) -> Resolved:
        """Every default decided, for `model` (a name, path or .gguf, None for the embedded model, or a
        `LoadedModel`, whose loading was decided when it loaded): what `build_runtime` builds."""
        from specdraft.models import LoadedModel, model_device, plan_draft, plan_load  # torch: not in the CLI's parser

        loading = None if isinstance(model, LoadedModel) else plan_load(
            model, self.device, self.dtype, self.weights, self.arithmetic, eager=self.enforce_eager)
        draft = None
        if any(uses(name, "model") for name in self.served):  # the draft model, by the target's rules, on its device
            device = loading.device if loading is not None else model_device(model, self.device)
            draft = plan_draft(self.draft_model, device, self.dtype, self.weights, self.arithmetic, self.enforce_eager)
        return Resolved(drafters=tuple(self.served), drafter_options=self.resolve_drafter_options(), k=self.k,
                        max_batch=self.max_batch, max_context=self.max_context, policy=self.policy,
                        compiled=not self.enforce_eager, calibrate=self.calibrate, recalibrate=self.recalibrate,
                        prefix_cache_bytes=self.prefix_cache_mb << 20, loading=loading, draft=draft)

    def resolve_drafter_options(self) -> dict[str, dict[str, Any]]:
        """Each drafter's options, by name. A composite gets its parts' options through the same path as
        the parts alone: each part takes the options of the drafter it is (`ngram`'s cross-request memory
        reaches `hybrid`'s n-gram part), unless the composite names its own under the part's name. (The
        `model` drafter's draft model is not an option: `resolve` plans it as it plans the target.)"""
        given = {name: dict(options) for name, options in (self.drafter_options or {}).items()}
        return {name: _with_parts(name, given) for name in self.served}

    def replace(self, **changes: Any) -> Settings:
        """These settings with `changes` (by field name), checked again; a name that is not a field is
        refused by name."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"the options: {', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """`Settings` with every default decided (`Settings.resolve`): `build_runtime` builds it as it is."""

    drafters: tuple[str, ...]  # every drafter built, the default first
    drafter_options: Mapping[str, Mapping[str, Any]]  # each drafter's, a composite's parts' under the part's name
    k: int
    max_batch: int
    max_context: int | None  # the most served; None: the model's
    policy: Policy
    compiled: bool  # steps compiled (CUDA graphs on CUDA, the compiled step on CPU): not enforce_eager
    calibrate: bool
    recalibrate: bool  # measure the costs at start even where a calibration is kept for them
    prefix_cache_bytes: int
    loading: Loading | None  # how the target loads (`models.plan_load`); None: it came loaded
    draft: DraftPlan | None = None  # how the model drafter's model loads (`models.plan_draft`); None: no drafter uses one

    @property
    def default_drafter(self) -> str:
        return self.drafters[0]

    def context(self, model_context: int, default: int | None = None) -> int:
        """The context served on a model whose own is `model_context`: a `max_context` beyond it is
        cut to it, with a warning saying so; without one, `default` where given (a LongRoPE model's
        original context: `models.long_rope`), else the model's."""
        if self.max_context and self.max_context > model_context:
            log.warning("max_context (--max-model-len) %d is more than the model's context: serving %d tokens",
                        self.max_context, model_context)
        return min(self.max_context, model_context) if self.max_context else min(default or model_context, model_context)


def default(name: str) -> Any:
    """The default of the `Settings` field `name` (the CLI's flags show and leave it)."""
    return Settings.__dataclass_fields__[name].default


def server_drafters() -> list[str]:
    """The drafters a server builds unless told (`specdraft serve` without --drafters): the default
    drafter, the other built-ins requests choose among, then every installed plugin."""
    builtins = [DEFAULT_DRAFTER, *(name for name in ("ngram", "none", "model", "hybrid") if name != DEFAULT_DRAFTER)]
    return builtins + [name for name in drafter_names() if not is_builtin(name)]


def _with_parts(name: str, given: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    options = dict(given.get(name, {}))
    for part, drafter in drafter_parts(name).items():
        options[part] = {**_with_parts(drafter, given), **options.get(part, {})}
    return options


def built_on(name: str) -> set[str]:
    """The drafters a composite is built on, at any depth."""
    parts = set(drafter_parts(name).values())
    return parts.union(*(built_on(part) for part in parts))


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
