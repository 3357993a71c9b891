"""A loaded model (`LoadedModel`: the model, its tokenizer and what decoding needs to know of it),
and what is read off one: its vocabulary, its device, the bytes its linear layers hold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.backend.weights import read_tensors


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    path: Path  # what was loaded: a GGUF read natively, a GGUF's converted cache (dense), or a directory
    max_context: int
    eos_token_ids: tuple[int, ...]
    few_rows_linears: bool = False  # its linear layers are `FewRowsLinear`s
    compute_dtype: torch.dtype | None = None  # the activations' dtype where it is not the weights' (int8 copies)
    target_copy: bool = False  # a draft built from the target's own layers (`int8_copy`): its keys and values mean the target's
    weights: str = "dense"  # "native": its quantised linears read the GGUF's blocks (`backend.native`); "dense": float
    arithmetic: str = "float32"  # "int8": its native linears compute in the kernel's int8 arithmetic


def vocab_size(loaded: LoadedModel) -> int:
    """Rows of the output layer: the vocabulary after padding, the ids a model can produce."""
    return int(loaded.model.get_output_embeddings().out_features)


def model_device(loaded: LoadedModel, otherwise: str | None = None) -> torch.device | str | None:
    """Where a loaded model's weights lie (`otherwise` for a model without any)."""
    parameter = next(loaded.model.parameters(), None) if isinstance(loaded.model, torch.nn.Module) else None
    return parameter.device if parameter is not None else otherwise


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights (or GGUF blocks) of a model's linear layers, the output layer included:
    what its decode step reads, less the norms and one embedding row."""
    tensors = {t.data_ptr(): t for m in model.modules() for t in read_tensors(m)}
    return sum(t.numel() * t.element_size() for t in tensors.values())
