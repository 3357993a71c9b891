"""Assemble a ready engine from a model and its `Settings` (`build_runtime`), and encode prompts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from specdraft.backend import StaticShapes, llama, worth_compiling
from specdraft.drafters import Drafter, Resources, create_drafter, is_builtin
from specdraft.engine import Engine, RequestError
from specdraft.grammar import GrammarCompiler
from specdraft.models import LoadedModel, load, release_freed_memory
from specdraft.settings import Settings
from specdraft.text import check_text
from specdraft.verifier import Verifier

log = logging.getLogger("specdraft")


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str  # the default drafter
    skipped: dict[str, str] = field(default_factory=dict)  # plugin drafters that failed to build: why
    resources: Resources = field(default_factory=Resources)  # what its drafters share; `save()` saves their state


def build_drafters(names: Sequence[str], k: int, target: LoadedModel, options: Mapping[str, Mapping[str, Any]],
                   resources: Resources) -> tuple[dict[str, Drafter], dict[str, str]]:
    """Build and warm each named drafter once, with its options (already resolved:
    `Settings.resolve_drafter_options`), all sharing `resources`. A plugin that fails to build is left
    out, with a warning naming it (returned as name -> why); a built-in one that fails raises."""
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


def build_runtime(model: str | LoadedModel | None = None, settings: Settings | None = None) -> Runtime:
    """The one assembly of an engine (the server, the CLI, `specdraft.LLM` and the benchmarks use it).
    model: a name, path or .gguf, or an already loaded `LoadedModel` (default: the embedded model);
    settings: the engine's options (default: `Settings()`), checked when they were made. It builds
    what `Settings.resolve` decides, and decides nothing itself."""
    plan = (settings or Settings()).resolve(model)
    target = model if plan.loading is None else load(plan.loading)
    context = plan.context(target.max_context)
    static = static_shapes(target, plan.max_batch, context, graphs=plan.compiled)
    resources = Resources(static, compiled=plan.compiled)
    built, skipped = build_drafters(plan.drafters, plan.k, target, plan.drafter_options, resources)
    verifier = Verifier(target.model, static, compiled=plan.compiled and worth_compiling(target.model),
                        prefix_cache_bytes=plan.prefix_cache_bytes)
    grammar = GrammarCompiler(target.tokenizer, verifier.vocab_size, target.eos_token_ids)
    engine = Engine(verifier, built, target.tokenizer, target.eos_token_ids, context, k=plan.k,
                    max_batch=plan.max_batch, default_drafter=plan.default_drafter, policy=plan.policy,
                    calibrate=plan.calibrate, grammar=grammar)
    release_freed_memory()  # what building freed (draft copies' float32 transients) leaves the process
    return Runtime(engine, target, plan.default_drafter, skipped, resources)


def static_shapes(target: LoadedModel, max_batch: int, context: int, graphs: bool = True) -> StaticShapes | None:
    """Static shapes (a preallocated cache, and CUDA graphs unless `graphs` is False) where they pay:
    on CUDA, for models our own forward runs. On CPU a step is bound by the weights, not by launches,
    and the dynamic path (attending over exactly the rows' lengths) is faster."""
    if next(target.model.parameters()).device.type != "cuda" or not llama.supports(target.model):
        return None
    return StaticShapes(max_rows=max_batch, max_context=context, graphs=graphs)


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids for a prompt: chat-templated (a string becomes one user turn) or raw text. Text that is
    only whitespace is refused (`check_text`): it tokenizes to some tokens, which the engine's intake
    check (`Engine.resolve`) cannot tell from a prompt."""
    if isinstance(prompt, str):
        check_text(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(t) for t in ids]
    if not isinstance(prompt, str):
        raise RequestError("a list of messages needs a model with a chat template")
    return [int(t) for t in tokenizer(prompt).input_ids]
