"""Which code reads a model's weights, decided in one place (`reader`): the compiled kernel
(`csrc/`: float32 rows and GGUF blocks, on CPU, where it compiles), numba's loops (float32 or
int8 rows) or torch (the rest: other dtypes, other devices, blocks where no kernel compiles)."""

from __future__ import annotations

import enum
from typing import Iterable

import torch

from specdraft.backend.native.library import kernel_problem


class Storage(enum.Enum):
    """How a layer holds its weights (`weights.storage` says it of a module)."""

    FLOAT32 = "float32 rows"
    BLOCKS = "GGUF blocks"
    INT8 = "int8 rows with per-row scales"
    OTHER = "another dtype or layer"


class Reader(enum.Enum):
    """The code that reads a layer's weights."""

    KERNEL = "the compiled kernel"
    NUMBA = "numba's loops"
    TORCH = "torch"


def reader(stored: Iterable[Storage], device: torch.device) -> Reader:
    """The code that reads weights stored so on `device`, all of them alike (a step's, or one
    tensor's): on CPU the compiled kernel where every one is float32 rows or blocks and the kernel
    compiles here, else numba's loops where they are all float32 or all int8; torch otherwise."""
    stored = set(stored)
    if device.type != "cpu" or not stored or Storage.OTHER in stored:
        return Reader.TORCH
    if stored <= {Storage.FLOAT32, Storage.BLOCKS} and kernel_problem() is None:
        return Reader.KERNEL
    if stored in ({Storage.FLOAT32}, {Storage.INT8}):
        return Reader.NUMBA
    return Reader.TORCH
