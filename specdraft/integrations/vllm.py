"""specdraft's drafters as vLLM's custom proposer (the experimental `custom_class` hook, V1 model
runner):

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "specdraft.integrations.vllm.Proposer",
                                   "num_speculative_tokens": 5})

vLLM builds `Proposer(vllm_config)` in each worker and, after every step's bookkeeping, calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)` with one entry per
batch row; it returns one draft (a list of token ids, possibly empty) per row. vLLM verifies every
draft, so its output is the same as without speculation.

Choosing the drafter: `additional_config={"specdraft": {"drafter": NAME, "options": {...}}}` (for
`vllm serve`: `--additional-config '{"specdraft": {...}}'`) or, when that key is absent, the
environment variables SPECDRAFT_VLLM_DRAFTER (a name) and SPECDRAFT_VLLM_DRAFTER_OPTIONS (a JSON
object of the drafter's options). Default: the registry's `DEFAULT_DRAFTER` (`ngram`) with its
default options. Any registered drafter that needs no second model runs (`none`, `ngram`,
`prompt-lookup-scan`); those built from a loaded target model (`model`, `hybrid`) are refused. The drafter's `k` is `num_speculative_tokens`; the
`ngram` drafter's EOS ids default to the model config's.

Rows are not requests: vLLM passes batch rows, which move as requests finish and arrive. Its model
runner knows each row's request id (`input_batch.req_ids`) but the hook hands the proposer only the
config and these arrays, and reaching into the runner would be no supported interface; so rows are
matched to requests by their contents. A `RowTracker` (`specdraft.integrations.rows`) keeps each
request's drafter state across steps (built once, then extended). A mismatch between a tracked
context and the row's `token_ids_cpu` is detected from the length, this step's tokens, the last
draft and probes of the context (its last 8 tokens, 8 spread positions and a window that moves
along it), in O(1) per row and step; the row's request is then rebuilt from `token_ids_cpu`
(`end` + `begin`) instead of drafting from a wrong context. The RowTracker docstring has the details.

`vllm_model_dir` makes a checkpoint converted by `specdraft.models` (the embedded model) loadable by vLLM.

vLLM is imported for type hints only: this module imports, and is tested with fake inputs, without it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from specdraft.drafters import DEFAULT_DRAFTER, Drafter, create_drafter, drafter_names, drafter_options, needs_target
from specdraft.integrations.rows import RowTracker

if TYPE_CHECKING:
    from vllm.config import VllmConfig

CONFIG_KEY = "specdraft"
ENV_DRAFTER = "SPECDRAFT_VLLM_DRAFTER"
ENV_OPTIONS = "SPECDRAFT_VLLM_DRAFTER_OPTIONS"


@dataclass(frozen=True)
class DrafterChoice:
    """Which drafter runs inside vLLM, with its options (keyword arguments of its factory)."""

    name: str = DEFAULT_DRAFTER
    options: dict[str, Any] = field(default_factory=dict)


def drafter_choice(additional_config: Any, environ: Mapping[str, str]) -> DrafterChoice:
    """Read the choice from vLLM's `additional_config["specdraft"]`, else from the environment."""
    section = additional_config.get(CONFIG_KEY) if isinstance(additional_config, Mapping) else None
    if section is not None:
        where = f"additional_config[{CONFIG_KEY!r}]"
        if not isinstance(section, Mapping):
            raise ValueError(f"{where} must be an object with keys drafter, options; got {section!r}")
        unknown = sorted(set(section) - {"drafter", "options"})
        if unknown:
            raise ValueError(f"{where} has no key {unknown[0]!r}; its keys: drafter, options")
        name, options = section.get("drafter", DEFAULT_DRAFTER), section.get("options", {})
        name_where, options_where = f"{where}['drafter']", f"{where}['options']"
    else:
        name, raw = environ.get(ENV_DRAFTER, DEFAULT_DRAFTER), environ.get(ENV_OPTIONS, "")
        try:
            options = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_OPTIONS} must be a JSON object, got {raw!r} ({exc})") from None
        name_where, options_where = ENV_DRAFTER, ENV_OPTIONS
    if not isinstance(name, str) or not name:
        raise ValueError(f"{name_where} must be a drafter name, got {name!r}")
    if not isinstance(options, Mapping):
        raise ValueError(f"{options_where} must be a JSON object of drafter options, got {options!r}")
    return DrafterChoice(name, dict(options))


def build_drafter(choice: DrafterChoice, k: int, eos_token_ids: Sequence[int]) -> Drafter:
    """The chosen drafter, for drafts of up to k tokens; refuses drafters that need a second model."""
    if choice.name in drafter_names() and needs_target(choice.name):
        usable = [name for name in drafter_names() if not needs_target(name)]
        raise ValueError(f"drafter {choice.name!r} needs a second model, which vLLM's custom proposer hook "
                         f"cannot give it; inside vLLM use one of: {', '.join(usable)}")
    options = dict(choice.options)
    if "eos_token_ids" in drafter_options(choice.name):
        options.setdefault("eos_token_ids", tuple(eos_token_ids))
    return create_drafter(choice.name, k=k, **options)


def eos_token_ids(vllm_config: VllmConfig) -> tuple[int, ...]:
    """The model's EOS ids as its Hugging Face config states them (int, list or absent)."""
    eos = getattr(vllm_config.model_config.hf_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


class Proposer:
    """vLLM's custom proposer: drafts with a specdraft drafter for the rows of vLLM's batch."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        max_model_len = int(vllm_config.model_config.max_model_len)
        choice = drafter_choice(getattr(vllm_config, "additional_config", None), os.environ)
        self.drafter_name = choice.name
        drafter = build_drafter(choice, self.k, eos_token_ids(vllm_config))
        capacity = int(vllm_config.scheduler_config.max_num_seqs)
        self.rows = RowTracker(drafter, k=self.k, max_model_len=max_model_len, capacity=capacity)

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,  # unused: drafts need no KV cache
    ) -> list[list[int]]:
        """Per row i: `sampled_token_ids[i]`, the tokens that joined it this step (empty during a
        chunked prefill); `token_ids_cpu[i, :num_tokens_no_spec[i]]`, its context. Returns row i's draft."""
        return self.rows.step(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load; vLLM's CPU model runner calls this on every drafter."""


TIED_AS_HEAD = "lm_head.weight"
TIED_AS_EMBEDDING = "model.embed_tokens.weight"


def vllm_model_dir(model_dir: str | Path) -> Path:
    """A directory vLLM loads correctly for a single-file checkpoint whose tied embedding is stored
    only as `lm_head.weight`, as `specdraft.models.gguf_cache.convert_gguf` writes it (vLLM skips that tensor
    for tied models and would run with an unloaded embedding, silently): the same files with that
    tensor stored as `model.embed_tokens.weight`, written once under the cache dir's `vllm/`. Any
    other directory is returned as it is."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from specdraft.params import cache_dir

    source = Path(model_dir)
    weights = source / "model.safetensors"
    if not weights.is_file():
        return source
    with safe_open(str(weights), "pt") as f:
        names = set(f.keys())
    if TIED_AS_EMBEDDING in names or TIED_AS_HEAD not in names:
        return source
    target = cache_dir() / "vllm" / source.name
    if (target / "model.safetensors").is_file():
        return target
    with safe_open(str(weights), "pt") as f:
        tensors = {TIED_AS_EMBEDDING if name == TIED_AS_HEAD else name: f.get_tensor(name) for name in names}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / "done"
        shutil.copytree(source, staged, ignore=shutil.ignore_patterns("model.safetensors"))
        save_file(tensors, str(staged / "model.safetensors"), metadata={"format": "pt"})
        if not target.exists():  # another process may have finished first
            staged.rename(target)
    return target
