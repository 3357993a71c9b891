"""Assemble a ready engine from user-level choices (model, drafters, k) and encode prompts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from specdraft.backend import StaticShapes, llama
from specdraft.backend.fused import FusedLayers
from specdraft.drafters import Drafter, check_options, create_drafter, drafter_names, drafter_options, is_builtin
from specdraft.drafters.memory import DEFAULT_CAPACITY, NgramMemory
from specdraft.drafters.ngram import open_memory
from specdraft.engine import Engine, RequestError
from specdraft.grammar import GrammarCompiler
from specdraft.models import LoadedModel, load_draft_model, load_model
from specdraft.params import check_num_speculative_tokens, check_policy
from specdraft.verifier import Verifier

log = logging.getLogger("specdraft")


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str  # the default drafter
    skipped: dict[str, str] = field(default_factory=dict)  # plugin drafters that failed to build: why
    ngram_memory: NgramMemory | None = None  # the cross-request memory of `ngram` and hybrid's n-gram part


def drafters_with_a_model(names: Sequence[str], draft_model: str | None) -> list[str]:
    """The named drafters that draft with a model; a draft model given to none of them is refused."""
    with_model = [n for n in names if "draft_model" in drafter_options(n)]
    if draft_model is not None and not with_model:
        raise ValueError(f"a draft model is used by the model and hybrid drafters, not by {', '.join(map(repr, names))}")
    return with_model


def resolve_options(names: Sequence[str], drafter_options: Mapping[str, Mapping[str, Any]] | None
                    ) -> tuple[dict[str, dict[str, Any]], NgramMemory | None]:
    """Each named drafter's options. Keys must name drafters being built. A composite gets its parts'
    options through the same path as the parts alone: hybrid's n-gram part takes `ngram`'s (unless
    hybrid names its own), and one cross-request memory serves both."""
    given = {name: dict(options) for name, options in (drafter_options or {}).items()}
    parts = {"ngram"} if "hybrid" in names else set()  # options of a composite's part
    stray = sorted(set(given) - set(names) - parts)
    if stray:
        raise ValueError(f"drafter options name {stray[0]!r}, which is not among the drafters: {', '.join(names)}")
    for name, options in given.items():
        if not isinstance(options, Mapping):
            raise ValueError(f"the options of drafter {name!r} must be an object of option names, got {options!r}")
        check_options(name, options)  # refused by name before anything loads, plugins' too
    ngram = given.get("ngram", {})
    memory = None
    if ngram.get("memory") or ngram.get("memory_path") is not None:
        memory = open_memory(bool(ngram.get("memory")), ngram.get("memory_path"),
                             ngram.get("memory_capacity", DEFAULT_CAPACITY))
        ngram = {key: value for key, value in ngram.items() if key not in ("memory_path", "memory_capacity")}
        ngram["memory"] = memory
        given["ngram"] = ngram
    if "hybrid" in names:
        given.setdefault("hybrid", {}).setdefault("ngram", ngram)
    return given, memory


def build_drafters(names: Sequence[str], k: int, target: LoadedModel, draft_model: str | LoadedModel | None = None,
                   dtype: str = "auto", options: Mapping[str, Mapping[str, Any]] | None = None,
                   static: StaticShapes | None = None, fused: bool = False) -> tuple[dict[str, Drafter], dict[str, str]]:
    """Build and warm each named drafter once, with its options (already resolved: `resolve_options`).
    The drafters that draft with a model (`model`, `hybrid`) share one draft model, loaded (or built)
    once, and run at `static` shapes if given, compiled on CPU if `fused` and it pays. A plugin that fails to build is left out, with a
    warning naming it (returned as name -> why); a built-in one that fails raises."""
    with_model = drafters_with_a_model(names, draft_model)
    shared = load_draft_model(draft_model, target, dtype) if with_model else None
    drafters, skipped = {}, {}
    for name in names:
        given = dict((options or {}).get(name, {}))
        if name in with_model:
            given = {"draft_model": shared, "static_shapes": static, "fused": fused and FusedLayers.pays(shared.model),
                     **given}
        try:
            drafters[name] = create_drafter(name, k=k, target=target, **given)
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
    k: int = 5,
    max_batch: int = 8,
    device: str | None = None,
    dtype: str = "auto",
    draft_model: str | LoadedModel | None = None,
    max_context: int | None = None,
    drafter_options: Mapping[str, Mapping[str, Any]] | None = None,
    policy: str = "auto",
    enforce_eager: bool = False,
    calibrate: bool = True,
) -> Runtime:
    """The one assembly of an engine (the server, the CLI, `specdraft.LLM` and the benchmarks use it).

    model: a name, path or .gguf, or an already loaded `LoadedModel` (default: the embedded model);
    drafter: the default drafter (default: the first of `drafters`, else `ngram`); drafters: every
    drafter requests may choose; drafter_options: each drafter's options by name; policy: the
    requests' default (`auto` or `fixed`); enforce_eager: no CUDA graphs, no compiled CPU step."""
    check_num_speculative_tokens(k, "k")
    check_policy(policy)
    names = list(dict.fromkeys([*([drafter] if drafter else []), *(drafters or [])])) or ["ngram"]
    default = drafter or names[0]
    unknown = [n for n in names if n not in drafter_names()]
    if unknown:
        raise ValueError(f"unknown drafter {unknown[0]!r}; choose one of: {', '.join(drafter_names())}")
    drafters_with_a_model(names, draft_model)  # refuse a pointless draft model before loading anything
    options, memory = resolve_options(names, drafter_options)
    target = model if isinstance(model, LoadedModel) else load_model(model, device=device, dtype=dtype)
    context = min(max_context, target.max_context) if max_context else target.max_context
    static = static_shapes(target, max_batch, context, graphs=not enforce_eager)
    built, skipped = build_drafters(names, k, target, draft_model, dtype, options, static, fused=not enforce_eager)
    fused = not enforce_eager and FusedLayers.pays(target.model)  # applies on CPU only (`FusedLayers.applies`)
    verifier = Verifier(target.model, static, fused=fused)
    grammar = GrammarCompiler(target.tokenizer, verifier.vocab_size, target.eos_token_ids)
    engine = Engine(verifier, built, target.tokenizer, target.eos_token_ids, context, k=k, max_batch=max_batch,
                    default_drafter=default, policy=policy, calibrate=calibrate, grammar=grammar)
    return Runtime(engine, target, default, skipped, memory)


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


def set_threads() -> None:
    """Use every core for intra-op work on CPU (the default already does; kept explicit for servers)."""
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, torch.get_num_threads()))
