"""Where a GGUF's tensors lie in its file: the value `models.gguf_check.check_gguf` returns once the
header and tensor infos have been read and checked, and `gguf_file.read_gguf` maps the tensors by.
It lives here, in the kernel wing, so that the wing reads no floor above it; the check hands it down."""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGMLQuantizationType


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order: the row length first
    offset: int  # from the data section's start
    nbytes: int


@dataclass(frozen=True)
class GgufLayout:
    version: int
    architecture: str
    alignment: int
    data_start: int  # the data section's byte offset in the file
    size: int  # the file's size in bytes
    tensors: tuple[TensorInfo, ...]
