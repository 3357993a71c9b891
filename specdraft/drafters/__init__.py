"""Drafter registry: maps a name (`none`, `ngram`, `model`, `hybrid`, ...) to a factory.

Every drafter is built with `create_drafter(name, k=..., target=..., **options)`:
- `k`: the longest draft it will ever be asked for (it sizes its buffers for it);
- `target`: the loaded target model (`specdraft.models.LoadedModel`), handed only to factories that
  declare a `target` parameter (for its EOS ids, vocabulary, device, weights);
- `options`: the drafter's own keyword arguments. A factory declares each one it takes; an option it
  does not declare is refused with a message naming it and the options it does take.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter
from specdraft.params import check_num_speculative_tokens

DrafterFactory = Callable[..., Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}
# Built-in drafters by name and module, imported on first use: listing names (the CLI's choices)
# must not import torch models or compile numba kernels.
_BUILTIN = {"none": "none", "ngram": "ngram", "prompt-lookup-scan": "prompt_lookup", "model": "model", "hybrid": "hybrid"}
_SUPPLIED = ("k", "target")  # passed by the registry itself, not user options


def register(name: str) -> Callable[[DrafterFactory], DrafterFactory]:
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        assert name not in _REGISTRY, f"drafter {name!r} registered twice"
        _REGISTRY[name] = factory
        return factory

    return wrap


def drafter_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def drafter_options(name: str) -> list[str]:
    """The options a drafter's factory takes (besides `k` and `target`)."""
    parameters = inspect.signature(_factory(name)).parameters
    return [p for p in parameters if p not in _SUPPLIED]


def needs_target(name: str) -> bool:
    """Whether the drafter can only be built from a loaded target model: its factory requires
    `target` (`ngram` takes one optionally, for the target's EOS ids)."""
    target = inspect.signature(_factory(name)).parameters.get("target")
    return target is not None and target.default is inspect.Parameter.empty


def create_drafter(name: str, *, k: int = 5, target: Any = None, **options: Any) -> Drafter:
    factory = _factory(name)
    check_num_speculative_tokens(k, "k")
    takes = drafter_options(name)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        listed = ", ".join(takes) if takes else "none"
        raise ValueError(f"drafter {name!r} has no option {unknown[0]!r}; its options: {listed}")
    parameters = inspect.signature(factory).parameters
    supplied = {key: value for key, value in (("k", k), ("target", target)) if key in parameters}
    return factory(**supplied, **options)


def _factory(name: str) -> DrafterFactory:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(f"specdraft.drafters.{_BUILTIN[name]}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter {name!r}; choose one of: {', '.join(drafter_names())}")
    return _REGISTRY[name]


__all__ = ["Draft", "Drafter", "EMPTY_DRAFT", "create_drafter", "drafter_names", "drafter_options", "needs_target",
           "register"]
