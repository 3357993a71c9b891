"""Drafter registry: maps a name (`none`, `ngram`, `model`, `hybrid`, a plugin's, ...) to a factory.

Every drafter is built with `create_drafter(name, k=..., target=..., **options)`:
- `k`: the longest draft it will ever be asked for (it sizes its buffers for it);
- `target`: the loaded target model (`specdraft.models.LoadedModel`), handed only to factories that
  declare a `target` parameter (for its EOS ids, vocabulary, device, weights);
- `options`: the drafter's own keyword arguments. A factory declares each one it takes; an option it
  does not declare is refused with a message naming it and the options it does take (a factory
  that takes `**options` gets every option, unchecked).

Built-in drafters register themselves with `@register(name)` when their module is imported.
Third-party drafters are plugins: an installed package declares its factory as an entry point in
the group `specdraft.drafters` (`name = "pkg.module:factory"` under
`[project.entry-points."specdraft.drafters"]`). `load_plugins` imports them once, on the first
question asked of the registry; a plugin that fails to import, or whose name is taken, is left out
with a warning naming it (logger `specdraft`) and recorded in `plugin_errors()`, and the others load.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Mapping

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter
from specdraft.params import check_num_speculative_tokens

DrafterFactory = Callable[..., Drafter]
PLUGIN_GROUP = "specdraft.drafters"
REQUIRED = inspect.Parameter.empty  # the default of an option that has none (`drafter_option_defaults`)
log = logging.getLogger("specdraft")

_REGISTRY: dict[str, DrafterFactory] = {}
# Built-in drafters by name and module, imported on first use: listing names (the CLI's choices)
# must not import torch models or compile numba kernels.
_BUILTIN = {"none": "none", "ngram": "ngram", "prompt-lookup-scan": "prompt_lookup", "model": "model", "hybrid": "hybrid"}
_SUPPLIED = ("k", "target")  # passed by the registry itself, not user options
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # the kinds an option may be
_PLUGINS: dict[str, str] = {}  # a plugin that loaded -> its origin, "plugin: <distribution> (<module:attr>)"
_PLUGIN_ERRORS: dict[str, str] = {}  # a plugin that was left out -> its origin and why
_plugins_loaded = False


def register(name: str) -> Callable[[DrafterFactory], DrafterFactory]:
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        assert name not in _REGISTRY, f"drafter {name!r} registered twice"
        _REGISTRY[name] = factory
        return factory

    return wrap


class _Refused(Exception):
    """A plugin declared in a way the registry cannot take (the message says why)."""


def load_plugins(rescan: bool = False) -> None:
    """Import the drafters declared in the `specdraft.drafters` entry-point group, once: later calls
    do nothing unless `rescan` (after installing a package into a running process), which forgets
    the plugins found before and looks again. Where two packages declare one name, the first found
    on the path is taken."""
    global _plugins_loaded
    if _plugins_loaded and not rescan:
        return
    _plugins_loaded = True
    for name in _PLUGINS:
        del _REGISTRY[name]
    _PLUGINS.clear()
    _PLUGIN_ERRORS.clear()
    importlib.invalidate_caches()
    for entry in entry_points(group=PLUGIN_GROUP):
        origin = f"plugin: {entry.dist.name if entry.dist else 'unknown distribution'} ({entry.value})"
        try:
            factory = _load_plugin(entry)
        except _Refused as exc:
            _leave_out(entry.name, origin, str(exc))
        except Exception as exc:  # a third party's import may raise anything; it must not stop the others
            _leave_out(entry.name, origin, f"{type(exc).__name__}: {exc}")
        else:
            _REGISTRY[entry.name] = factory
            _PLUGINS[entry.name] = origin


def _load_plugin(entry: EntryPoint) -> DrafterFactory:
    name = entry.name
    if name in _BUILTIN:
        raise _Refused(f"the name {name!r} is taken by a built-in drafter")
    if name in _REGISTRY:
        raise _Refused(f"the name {name!r} is taken by {drafter_origin(name)}")
    if not name or any(c in name for c in ", \t"):
        raise _Refused(f"a drafter name has no commas or spaces, got {name!r}")
    factory = entry.load()
    if not callable(factory):
        raise _Refused(f"{entry.value} is a {type(factory).__name__}, not a factory (module:callable)")
    return factory


def _leave_out(name: str, origin: str, why: str) -> None:
    _PLUGIN_ERRORS[name] = f"{origin}: {why}"
    log.warning("drafter plugin %r is left out (%s): %s", name, origin, why)


def plugin_errors() -> dict[str, str]:
    """The plugins that were left out, by name: where each was declared and why it was left out."""
    load_plugins()
    return dict(_PLUGIN_ERRORS)


def drafter_names() -> list[str]:
    load_plugins()
    return sorted(set(_BUILTIN) | set(_REGISTRY))


def is_builtin(name: str) -> bool:
    return name in _BUILTIN


def drafter_origin(name: str) -> str:
    """Where a drafter comes from: `built-in`, `plugin: <distribution> (<module:attr>)`, or
    `registered by <module>` (a `register` call outside the package)."""
    if name in _BUILTIN:
        return "built-in"
    factory = _factory(name)
    return _PLUGINS.get(name) or f"registered by {factory.__module__}"


def drafter_options(name: str) -> list[str]:
    """The options a drafter's factory declares (besides `k` and `target`)."""
    return list(drafter_option_defaults(name))


def drafter_option_defaults(name: str) -> dict[str, Any]:
    """Each option a drafter's factory declares, with its default (`REQUIRED` where it has none)."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    return {p.name: p.default for p in parameters if p.name not in _SUPPLIED and p.kind in _NAMED}


def takes_any_option(name: str) -> bool:
    """Whether the drafter's factory takes `**options`: then every option reaches it, unchecked."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse, by name, an option the drafter does not take (before anything is loaded)."""
    if takes_any_option(name):
        return
    takes = drafter_options(name)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        listed = ", ".join(takes) if takes else "none"
        raise ValueError(f"drafter {name!r} has no option {unknown[0]!r}; its options: {listed}")


def needs_target(name: str) -> bool:
    """Whether the drafter can only be built from a loaded target model: its factory requires
    `target` (`ngram` takes one optionally, for the target's EOS ids)."""
    target = inspect.signature(_factory(name)).parameters.get("target")
    return target is not None and target.default is inspect.Parameter.empty


def create_drafter(name: str, *, k: int = 5, target: Any = None, **options: Any) -> Drafter:
    factory = _factory(name)
    check_num_speculative_tokens(k, "k")
    check_options(name, options)
    parameters = inspect.signature(factory).parameters
    supplied = {key: value for key, value in (("k", k), ("target", target)) if key in parameters}
    return factory(**supplied, **options)


def _factory(name: str) -> DrafterFactory:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(f"specdraft.drafters.{_BUILTIN[name]}")
    load_plugins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _PLUGIN_ERRORS:
        raise ValueError(f"drafter {name!r} was left out: {_PLUGIN_ERRORS[name]}")
    raise ValueError(f"unknown drafter {name!r}; choose one of: {', '.join(drafter_names())}")


__all__ = ["Draft", "Drafter", "EMPTY_DRAFT", "PLUGIN_GROUP", "REQUIRED", "check_options", "create_drafter",
           "drafter_names", "drafter_option_defaults", "drafter_options", "drafter_origin", "is_builtin",
           "load_plugins", "needs_target", "plugin_errors", "register", "takes_any_option"]
