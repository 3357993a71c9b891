"""Drafters: the contract every drafter keeps (`base.py`: `Drafter`, `Draft`, `Parts`, `Resources`),
the registry that builds them by name (`registry.py`, plugins included), and one drafter per file
(`none`, `ngram` with its tables and cross-request memory, `prompt-lookup-scan`, `model`, `hybrid`)."""

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Drafter, Resources
from specdraft.drafters.registry import (DEFAULT_DRAFTER, PLUGIN_GROUP, REQUIRED, Part, check_options, create_drafter,
                                         drafter_names, drafter_option_defaults, drafter_options, drafter_origin,
                                         drafter_parts, is_builtin, load_plugins, needs_target, plugin_errors,
                                         register, takes_any_option, uses)

__all__ = ["DEFAULT_DRAFTER", "Draft", "Drafter", "EMPTY_DRAFT", "PLUGIN_GROUP", "Part", "REQUIRED", "Resources",
           "check_options", "create_drafter", "drafter_names", "drafter_option_defaults", "drafter_options",
           "drafter_origin", "drafter_parts", "is_builtin", "load_plugins", "needs_target", "plugin_errors", "register",
           "takes_any_option", "uses"]
