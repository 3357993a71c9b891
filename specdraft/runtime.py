"""Assemble a ready engine from user-level choices (model, drafter, k) and encode prompts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.drafters import create_drafter
from specdraft.engine import Engine, RequestError
from specdraft.models import LoadedModel, load_model
from specdraft.verifier import Verifier


@dataclass
class Runtime:
    engine: Engine
    target: LoadedModel
    drafter_name: str


def build_runtime(
    model: str | None = None,
    drafter: str = "ngram",
    k: int = 5,
    max_batch: int = 8,
    device: str | None = None,
    dtype: str = "auto",
    draft_model: str | None = None,
    max_context: int | None = None,
) -> Runtime:
    target = load_model(model, device=device, dtype=dtype)
    options = {"draft_model": draft_model} if draft_model is not None else {}
    drafter_impl = create_drafter(drafter, k=k, target=target, **options)
    context = min(max_context, target.max_context) if max_context else target.max_context
    engine = Engine(Verifier(target.model), drafter_impl, target.tokenizer, target.eos_token_ids, context, k=k, max_batch=max_batch)
    return Runtime(engine, target, drafter)


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
