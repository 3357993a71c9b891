"""Drafter registry: maps a name (`none`, `ngram`, `model`, `hybrid`, a plugin's, ...) to a factory.

Every drafter is built with `create_drafter(name, k=..., target=..., resources=..., **options)`;
what the registry supplies is handed only to factories that declare a parameter of that name:
- `k`: the longest draft it will ever be asked for (it sizes its buffers for it);
- `target`: the loaded target model (`specdraft.models.LoadedModel`: its EOS ids, vocabulary,
  device, weights);
- `resources`: what the drafters of one runtime share (`specdraft.drafters.base.Resources`: a draft
  model loaded once, one cross-request memory, how the runtime runs models);
- `options`: the drafter's own keyword arguments. A factory declares each one it takes, or names
  the class whose constructor declares them and passes them on as `**options`
  (`register(name, options=cls)`); an option neither declares is refused with a message naming it
  and the options it does take, and a value its declaration rules out (text for an `int`, a number
  for a `bool`: annotations of bools, integers, numbers, strings and None are checked) with one
  naming the option and the type it takes (a factory that takes `**options` and names no class gets
  every option, unchecked).

A composite drafter declares its parts the same way, as parameters whose default is a `Part`
(`ngram: NgramDrafter = Part("ngram")`): the registry builds each part as that drafter, with the
options given for it under the parameter's name, and passes it in. A runtime gives each part the
options of the drafter it is (`specdraft.runtime`), so a composite gets its parts' options through
the same path as the parts alone.

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
import numbers
import types
import typing
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Mapping

from specdraft.drafters.base import Drafter, Resources
from specdraft.params import DEFAULT_NUM_SPECULATIVE_TOKENS, check_num_speculative_tokens

DrafterFactory = Callable[..., Drafter]
PLUGIN_GROUP = "specdraft.drafters"
DEFAULT_DRAFTER = "ngram"  # what a runtime serves when it is told no drafter
REQUIRED = inspect.Parameter.empty  # the default of an option that has none (`drafter_option_defaults`)
log = logging.getLogger("specdraft")

_REGISTRY: dict[str, DrafterFactory] = {}
_OPTIONS_FROM: dict[str, Callable] = {}  # a drafter whose factory passes its options on -> what declares them
# Built-in drafters by name and module, imported on first use: listing names (the CLI's choices)
# must not import torch models or compile numba kernels.
_BUILTIN = {"none": "none", "ngram": "ngram", "prompt-lookup-scan": "prompt_lookup", "model": "model", "hybrid": "hybrid"}
_SUPPLIED = ("k", "target", "resources")  # passed by the registry itself, not user options
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)  # the kinds an option may be
_PLUGINS: dict[str, str] = {}  # a plugin that loaded -> its origin, "plugin: <distribution> (<module:attr>)"
_PLUGIN_ERRORS: dict[str, str] = {}  # a plugin that was left out -> its origin and why
_plugins_loaded = False


@dataclass(frozen=True)
class Part:
    """The default of a composite's factory parameter that takes another drafter as a part: the
    registry builds `drafter` and passes it in."""

    drafter: str


def register(name: str, options: Callable | None = None) -> Callable[[DrafterFactory], DrafterFactory]:
    """Register a factory under `name`. options: the class (or function) whose keyword parameters are
    the drafter's options beyond the factory's own, which the factory passes on as `**options`."""
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        assert name not in _REGISTRY, f"drafter {name!r} registered twice"
        _REGISTRY[name] = factory
        if options is not None:
            _OPTIONS_FROM[name] = options
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
    """The options a drafter declares (besides what the registry supplies and its parts)."""
    return list(drafter_option_defaults(name))


def drafter_option_defaults(name: str) -> dict[str, Any]:
    """Each option a drafter declares, with its default (`REQUIRED` where it has none)."""
    return {option: parameter.default for option, parameter in _option_parameters(name).items()}


def _option_parameters(name: str) -> dict[str, inspect.Parameter]:
    """Each option a drafter declares, as the parameter that declares it."""
    declared = {p.name: p for p in _parameters(name) if not isinstance(p.default, Part)}
    source = _OPTIONS_FROM.get(name)
    if source is None:
        return declared
    # In the declaring class's order; where the factory declares an option itself, its parameter.
    merged = {p.name: declared.pop(p.name, p) for p in inspect.signature(source).parameters.values()
              if p.kind in _NAMED and p.name not in _SUPPLIED}
    return {**merged, **declared}


def drafter_parts(name: str) -> dict[str, str]:
    """A composite's parts: parameter -> the drafter it is (none for a drafter that is not composite)."""
    return {p.name: p.default.drafter for p in _parameters(name) if isinstance(p.default, Part)}


def uses(name: str, drafter: str) -> bool:
    """Whether the drafter `name` is `drafter` or is built on it (as a part, at any depth)."""
    return name == drafter or any(uses(part, drafter) for part in drafter_parts(name).values())


def _parameters(name: str) -> list[inspect.Parameter]:
    """The factory's parameters a user may set: its options and parts."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    return [p for p in parameters if p.name not in _SUPPLIED and p.kind in _NAMED]


def takes_any_option(name: str) -> bool:
    """Whether every option reaches the drafter's factory, unchecked: it takes `**options` and names
    nothing that declares them."""
    parameters = inspect.signature(_factory(name)).parameters.values()
    return name not in _OPTIONS_FROM and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse, by name, an option the drafter does not take or a value of a type it does not take
    (before anything is loaded), a part's included."""
    parts = drafter_parts(name)
    for part, drafter in parts.items():
        given = options.get(part, {})
        if not isinstance(given, Mapping):
            raise ValueError(f"the options of drafter {name!r}'s part {part!r} must be an object of option names, "
                             f"got {given!r}")
        check_options(drafter, given)
    if takes_any_option(name):
        return
    takes = _option_parameters(name)
    unknown = sorted(set(options) - set(takes) - set(parts))
    if unknown:
        listed = ", ".join(takes) if takes else "none"
        raise ValueError(f"drafter {name!r} has no option {unknown[0]!r}; its options: {listed}")
    for option, value in options.items():
        kinds = _declared_kinds(takes[option]) if option in takes else None
        if kinds is not None and not _fits(value, kinds):
            named = [_KIND_NAMES[kind] for kind in kinds]
            expected = " or ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
            raise ValueError(f"drafter {name!r}: option {option!r} must be {expected}, got {value!r}")


# The kinds of value an option's type is checked against where it enters, each as a message names it.
_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "None (null)"}


def _declared_kinds(parameter: inspect.Parameter) -> tuple[type, ...] | None:
    """The kinds of value an option takes, where its annotation names only bools, integers, numbers,
    strings and None (`int | None`, as text or as types), or, with no annotation, its default is
    one of those; None where the option's declaration says nothing that simple (the drafter checks)."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:  # a default of 0 may stand for any number
        kinds = {bool: [bool], int: [float], float: [float], str: [str]}.get(type(parameter.default), [None])
    elif isinstance(annotation, str):
        by_name = {kind.__name__: kind for kind in _KIND_NAMES} | {"None": type(None)}
        kinds = [by_name.get(part.strip()) for part in annotation.split("|")]
    else:
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        named = typing.get_args(annotation) if union else [annotation]
        kinds = [type(None) if kind is None else kind for kind in named]
    return tuple(kinds) if all(kind in _KIND_NAMES for kind in kinds) else None


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether `value` is of one of `kinds`: a bool is no integer, an integer is a number."""
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, numbers.Integral):
        return int in kinds or float in kinds
    if isinstance(value, numbers.Real):
        return float in kinds
    return isinstance(value, tuple(kind for kind in kinds if kind not in (int, float, bool)))


def needs_target(name: str) -> bool:
    """Whether the drafter can only be built from a loaded target model: its factory, or a part's,
    requires `target` (`ngram` takes one optionally, for the target's EOS ids)."""
    target = inspect.signature(_factory(name)).parameters.get("target")
    required = target is not None and target.default is inspect.Parameter.empty
    return required or any(needs_target(part) for part in drafter_parts(name).values())


def create_drafter(name: str, *, k: int = DEFAULT_NUM_SPECULATIVE_TOKENS, target: Any = None,
                   resources: Resources | None = None, **options: Any) -> Drafter:
    """Build the drafter `name`: its parts first (a composite's options under a part's name are that
    part's), then the drafter itself with what it declares. One `resources` is shared by them all."""
    factory = _factory(name)
    check_num_speculative_tokens(k, "k")
    check_options(name, options)
    resources = resources if resources is not None else Resources()
    parts = {part: create_drafter(drafter, k=k, target=target, resources=resources, **options.pop(part, {}))
             for part, drafter in drafter_parts(name).items()}
    parameters = inspect.signature(factory).parameters
    supplied = {key: value for key, value in (("k", k), ("target", target), ("resources", resources)) if key in parameters}
    return factory(**supplied, **parts, **options)


def _factory(name: str) -> DrafterFactory:
    if name not in _REGISTRY and name in _BUILTIN:
        importlib.import_module(f"specdraft.drafters.{_BUILTIN[name]}")
    load_plugins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _PLUGIN_ERRORS:
        raise ValueError(f"drafter {name!r} was left out: {_PLUGIN_ERRORS[name]}")
    raise ValueError(f"unknown drafter {name!r}; choose one of: {', '.join(drafter_names())}")
