"""Assemble a ready engine from user-level choices (model, drafters, k) and encode prompts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdraft.backend import StaticShapes, llama
from specdraft.drafters import Drafter, create_drafter, drafter_options
from specdraft.engine import Engine, RequestError
from specdraft.models import LoadedModel, load_draft_model, load_model
from specdraft.verifier import Verifier


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str  # the default drafter


def drafters_with_a_model(names: Sequence[str], draft_model: str | None) -> list[str]:
    """The named drafters that draft with a model; a draft model given to none of them is refused."""
    with_model = [n for n in names if "draft_model" in drafter_options(n)]
    if draft_model is not None and not with_model:
        raise ValueError(f"a draft model is used by the model and hybrid drafters, not by {', '.join(map(repr, names))}")
    return with_model


def build_drafters(names: Sequence[str], k: int, target: LoadedModel, draft_model: str | None = None,
                   dtype: str = "auto", ngram_options: dict | None = None,
                   static: StaticShapes | None = None) -> dict[str, Drafter]:
    """Build and warm each named drafter once. The drafters that draft with a model (`model`,
    `hybrid`) share one draft model, loaded (or built) once, and run at `static` shapes if given."""
    with_model = drafters_with_a_model(names, draft_model)
    shared = load_draft_model(draft_model, target, dtype) if with_model else None
    drafters = {}
    for name in names:
        options = {"draft_model": shared, "static_shapes": static} if name in with_model else {}
        if name == "ngram" and ngram_options:
            options.update(ngram_options)
        drafters[name] = create_drafter(name, k=k, target=target, **options)
    return drafters


def build_runtime(
    model: str | None = None,
    drafter: str = "ngram",
    k: int = 5,
    max_batch: int = 8,
    device: str | None = None,
    dtype: str = "auto",
    draft_model: str | None = None,
    max_context: int | None = None,
    drafters: Sequence[str] | None = None,
    adaptive: bool = True,
    ngram_options: dict | None = None,
    enforce_eager: bool = False,
) -> Runtime:
    """drafter: the default drafter; drafters: every drafter requests may choose (default: just it);
    enforce_eager: no CUDA graphs."""
    names = list(dict.fromkeys([drafter, *(drafters or [])]))
    drafters_with_a_model(names, draft_model)  # refuse a pointless draft model before loading anything
    target = load_model(model, device=device, dtype=dtype)
    context = min(max_context, target.max_context) if max_context else target.max_context
    static = static_shapes(target, max_batch, context, graphs=not enforce_eager)
    built = build_drafters(names, k, target, draft_model, dtype, ngram_options, static)
    engine = Engine(Verifier(target.model, static), built, target.tokenizer, target.eos_token_ids, context, k=k,
                    max_batch=max_batch, default_drafter=drafter, adaptive=adaptive)
    return Runtime(engine, target, drafter)


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
