"""Assemble a ready engine from user-level choices (model, drafters, k) and encode prompts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from specdraft.backend import StaticShapes, llama, worth_compiling
from specdraft.drafters import (DEFAULT_DRAFTER, Drafter, Resources, check_options, create_drafter, drafter_names,
                                drafter_parts, is_builtin, uses)
from specdraft.engine import Engine, RequestError
from specdraft.grammar import GrammarCompiler
from specdraft.models import LoadedModel, load_model
from specdraft.params import (DEFAULT_MAX_BATCH, DEFAULT_NUM_SPECULATIVE_TOKENS, DEFAULT_POLICY,
                              DEFAULT_PREFIX_CACHE_MB, check_num_speculative_tokens, check_policy)
from specdraft.verifier import Verifier

log = logging.getLogger("specdraft")


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str  # the default drafter
    skipped: dict[str, str] = field(default_factory=dict)  # plugin drafters that failed to build: why
    resources: Resources = field(default_factory=Resources)  # what its drafters share; `save()` saves their state


def drafters_with_a_model(names: Sequence[str], draft_model: object | None) -> list[str]:
    """The named drafters that draft with a model (the `model` drafter, or one built on it); a draft
    model given to none of them is refused."""
    with_model = [n for n in names if uses(n, "model")]
    if draft_model is not None and not with_model:
        raise ValueError(f"a draft model is used by the model and hybrid drafters (and any built on model), not by "
                         f"{', '.join(map(repr, names))}")
    return with_model


def resolve_options(names: Sequence[str], drafter_options: Mapping[str, Mapping[str, Any]] | None,
                    draft_model: str | LoadedModel | None = None, dtype: str = "auto") -> dict[str, dict[str, Any]]:
    """Each named drafter's options. Keys must name drafters being built or the drafters they are
    built on. A composite gets its parts' options through the same path as the parts alone: each part
    takes the options of the drafter it is (`ngram`'s cross-request memory reaches `hybrid`'s n-gram
    part), unless the composite names its own. `draft_model` and `dtype` are the `model` drafter's."""
    given = {name: dict(options) if isinstance(options, Mapping) else options
             for name, options in (drafter_options or {}).items()}
    parts = {drafter for name in names for drafter in _built_on(name)}
    stray = sorted(set(given) - set(names) - parts)
    if stray:
        raise ValueError(f"drafter options name {stray[0]!r}, which is not among the drafters: {', '.join(names)}")
    for name, options in given.items():
        if not isinstance(options, dict):
            raise ValueError(f"the options of drafter {name!r} must be an object of option names, got {options!r}")
        check_options(name, options)  # refused by name before anything loads, plugins' too
    if drafters_with_a_model(names, draft_model):
        model = given.setdefault("model", {})
        if draft_model is not None:
            model.setdefault("draft_model", draft_model)
        model.setdefault("dtype", dtype)
    return {name: _with_parts(name, given) for name in names}


def _built_on(name: str) -> set[str]:
    """The drafters a composite is built on, at any depth."""
    parts = set(drafter_parts(name).values())
    return parts.union(*(_built_on(part) for part in parts))


def _with_parts(name: str, given: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    options = dict(given.get(name, {}))
    for part, drafter in drafter_parts(name).items():
        options[part] = {**_with_parts(drafter, given), **options.get(part, {})}
    return options


def build_drafters(names: Sequence[str], k: int, target: LoadedModel, options: Mapping[str, Mapping[str, Any]],
                   resources: Resources) -> tuple[dict[str, Drafter], dict[str, str]]:
    """Build and warm each named drafter once, with its options (already resolved: `resolve_options`),
    all sharing `resources`. A plugin that fails to build is left out, with a warning naming it
    (returned as name -> why); a built-in one that fails raises."""
    drafters, skipped = {}, {}
    for name in names:
        try:
            drafters[name] = create_drafter(name, k=k, target=target, resources=resources, **options.get(name, {}))
        except Exception as exc:
            if is_builtin(name):
                raise
            skipped[name] = f"{type(exc).__name__}: {exc}"
            log.warning("drafter plugin %r failed to build and is left out: %s", name, skipped[name])
    return drafters, skipped


def build_runtime(
    model: str | LoadedModel | None = None,
    drafter: str | None = None,
    drafters: Sequence[str] | None = None,
    k: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
    max_batch: int = DEFAULT_MAX_BATCH,
    device: str | None = None,
    dtype: str = "auto",
    draft_model: str | LoadedModel | None = None,
    max_context: int | None = None,
    drafter_options: Mapping[str, Mapping[str, Any]] | None = None,
    policy: str = DEFAULT_POLICY,
    enforce_eager: bool = False,
    calibrate: bool = True,
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
    weights: str = "auto",
) -> Runtime:
    """The one assembly of an engine (the server, the CLI, `specdraft.LLM` and the benchmarks use it).

    model: a name, path or .gguf, or an already loaded `LoadedModel` (default: the embedded model);
    drafter: the default drafter (default: the first of `drafters`, else `DEFAULT_DRAFTER`); drafters:
    every drafter requests may choose; drafter_options: each drafter's options by name; draft_model:
    the `model` drafter's (and so `hybrid`'s); policy: the requests' default (`auto` or `fixed`);
    enforce_eager: no CUDA graphs, no compiled CPU step; prefix_cache_mb: MiB of earlier requests'
    keys and values kept for later prompts that start alike (0: none); weights: a GGUF model's layers
    as its own blocks ("native", where they apply: `auto`, but not with `enforce_eager`, whose eager
    layers would dequantise them at every pass) or as float32 ("dense"), same logits."""
    check_num_speculative_tokens(k, "k")
    if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int) or prefix_cache_mb < 0:
        raise ValueError(f"prefix_cache_mb must be an integer >= 0 (0 turns the prefix cache off), got {prefix_cache_mb!r}")
    check_policy(policy)
    names = list(dict.fromkeys([*([drafter] if drafter else []), *(drafters or [])])) or [DEFAULT_DRAFTER]
    default = drafter or names[0]
    unknown = [n for n in names if n not in drafter_names()]
    if unknown:
        raise ValueError(f"unknown drafter {unknown[0]!r}; choose one of: {', '.join(drafter_names())}")
    options = resolve_options(names, drafter_options, draft_model, dtype)  # refused before anything loads
    if enforce_eager and weights == "auto":  # eager layers would dequantise every block at every pass
        weights = "dense"
    target = model if isinstance(model, LoadedModel) else load_model(model, device=device, dtype=dtype, weights=weights)
    context = min(max_context, target.max_context) if max_context else target.max_context
    static = static_shapes(target, max_batch, context, graphs=not enforce_eager)
    resources = Resources(static, compiled=not enforce_eager)
    built, skipped = build_drafters(names, k, target, options, resources)
    verifier = Verifier(target.model, static, compiled=not enforce_eager and worth_compiling(target.model),
                        prefix_cache_bytes=prefix_cache_mb << 20)
    grammar = GrammarCompiler(target.tokenizer, verifier.vocab_size, target.eos_token_ids)
    engine = Engine(verifier, built, target.tokenizer, target.eos_token_ids, context, k=k, max_batch=max_batch,
                    default_drafter=default, policy=policy, calibrate=calibrate, grammar=grammar)
    return Runtime(engine, target, default, skipped, resources)


def static_shapes(target: LoadedModel, max_batch: int, context: int, graphs: bool = True) -> StaticShapes | None:
    """Static shapes (a preallocated cache, and CUDA graphs unless `graphs` is False) where they pay:
    on CUDA, for models our own forward runs. On CPU a step is bound by the weights, not by launches,
    and the dynamic path (attending over exactly the rows' lengths) is faster."""
    if next(target.model.parameters()).device.type != "cuda" or not llama.supports(target.model):
        return None
    return StaticShapes(max_rows=max_batch, max_context=context, graphs=graphs)


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids for a prompt: chat-templated (a string becomes one user turn) or raw text."""
    if isinstance(prompt, str) and not prompt.strip():
        raise RequestError("prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(t) for t in ids]
    if not isinstance(prompt, str):
        raise RequestError("a list of messages needs a model with a chat template")
    return [int(t) for t in tokenizer(prompt).input_ids]
