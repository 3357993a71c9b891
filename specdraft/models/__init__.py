"""Models: found, planned, loaded and paired, one module a job.

- `find`: the catalogue of models known by name (fetched from the package index, verified, cached)
  and `resolve`, where a model argument points (a name, a path, a hub id). Light: no torch, so the
  CLI refuses a bad model argument before anything heavy loads.
- `plan`: how a model loads, every choice made once (`plan_load` -> `Loading`: device, dtype, native
  or dense weights, arithmetic), and the draft model by the same rules (`plan_draft` -> `DraftPlan`).
- `loader`: a model loaded as planned (`load`, `load_model`): a GGUF's blocks read natively, or a
  dense build from a directory, the hub's cache or a GGUF's conversion; int8 copies (`int8_copy`).
- `loaded`: what a load gives (`LoadedModel`) and what is read off one (`vocab_size`,
  `model_device`, `linear_bytes`).
- `pair`: the model drafter's model (`load_draft`; the default `self-int8` copy of the target),
  refused unless its token ids mean the target's (`check_draft_pair`).
- `gguf_check`: a GGUF checked before anything else reads it (`check_gguf` -> the kernel wing's
  `GgufLayout`).
- `gguf_cache`: what a GGUF leaves in the cache dir (its config and tokenizer, its dense conversion).
- `fused`: a family's fused projections (Phi-3's q/k/v, gate/up) split into their parts on loading.
- `long_rope`: Phi-3's LongRoPE, its frequencies fixed by the context served (`use_context`), read from a
  GGUF (`rope_parameters_of`).

The names below are re-exported here, each imported from its module on first use, so that importing
`specdraft.models.find` (the CLI does) loads no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdraft.models.find import EMBEDDED_FILE, SELF_DRAFT, embedded_gguf, resolve
    from specdraft.models.gguf_cache import convert_gguf
    from specdraft.models.loaded import LoadedModel, linear_bytes, model_device, vocab_size
    from specdraft.models.loader import int8_copy, load, load_model, release_freed_memory
    from specdraft.models.pair import check_draft_pair, load_draft
    from specdraft.models.plan import DraftPlan, Loading, native_problem, plan_draft, plan_load

_LAZY = {
    "specdraft.models.find": ("EMBEDDED_FILE", "SELF_DRAFT", "embedded_gguf", "resolve"),
    "specdraft.models.gguf_cache": ("convert_gguf",),
    "specdraft.models.loaded": ("LoadedModel", "linear_bytes", "model_device", "vocab_size"),
    "specdraft.models.loader": ("int8_copy", "load", "load_model", "release_freed_memory"),
    "specdraft.models.pair": ("check_draft_pair", "load_draft"),
    "specdraft.models.plan": ("DraftPlan", "Loading", "native_problem", "plan_draft", "plan_load"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'specdraft.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
