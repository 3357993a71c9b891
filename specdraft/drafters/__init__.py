"""Drafter registry: maps a name (`none`, `ngram`, `model`, `hybrid`, ...) to a factory.

A factory takes keyword arguments and uses those it needs; every drafter is built with
`create_drafter(name, k=..., vocab_size=..., device=..., draft_model=...)`.
"""

from __future__ import annotations

from typing import Any, Callable

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter

DrafterFactory = Callable[..., Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}


def register(name: str) -> Callable[[DrafterFactory], DrafterFactory]:
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        assert name not in _REGISTRY, f"drafter {name!r} registered twice"
        _REGISTRY[name] = factory
        return factory

    return wrap


def drafter_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def create_drafter(name: str, **options: Any) -> Drafter:
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter {name!r}; choose one of: {', '.join(drafter_names())}")
    return _REGISTRY[name](**options)


def _load_builtin() -> None:
    # Imported lazily so that importing the registry never compiles numba kernels.
    from specdraft.drafters import ngram, none, prompt_lookup  # noqa: F401


__all__ = ["Draft", "Drafter", "EMPTY_DRAFT", "create_drafter", "drafter_names", "register"]
