"""What a local GGUF file gets here (`specdraft models FILE.gguf`): whether it loads at all (the check every
load makes first, `gguf_check.check_gguf`, whose first problem is the answer where it fails), which of its
weights the block kernel reads as the file's own blocks (the kinds of `native.KINDS`) and which load as
float32 copies and why, and whether native weights run on this machine (`plan.native_problem`). It reads
the file's header and tensor infos only."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from specdraft.backend import native
from specdraft.backend.family import LONG_ROPE, ROPE_FREQS
from specdraft.backend.native.layout import GgufLayout, TensorInfo
from specdraft.errors import BadModelFileError
from specdraft.models.gguf_check import check_gguf
from specdraft.models.plan import native_problem

NATIVE_NAMES = tuple(kind.name for kind in native.KINDS.values())


def weights_of(tensors: tuple[TensorInfo, ...]) -> list[TensorInfo]:
    """The tensors a linear layer or the embedding holds (what native weights may read): not norms,
    biases or rotary factors (Llama 3's, Phi-3's LongRoPE)."""
    return [t for t in tensors if t.name.endswith(".weight") and "norm" not in t.name
            and t.name not in (ROPE_FREQS, *LONG_ROPE)]


def _census(weights: list[TensorInfo]) -> str:
    """'n in KIND (MB), ...' by kind, the most bytes first."""
    count, size = Counter(t.kind.name for t in weights), Counter()
    for t in weights:
        block, block_bytes = GGML_QUANT_SIZES[t.kind]
        elements = 1
        for dim in t.shape:
            elements *= dim
        size[t.kind.name] += elements // block * block_bytes
    return ", ".join(f"{count[name]} in {name} ({size[name] / 1e6:.{0 if size[name] >= 1e7 else 1}f} MB)"
                     for name, _ in size.most_common())


def read_as_blocks(t: TensorInfo) -> bool:
    """Whether the kernel reads the weight `t` as the file's blocks (`native.kind_of`), not a float32 copy."""
    return native.kind_of(t.kind.name, t.shape[0]) is not None


def _why_dense(kinds: set[str]) -> str:
    floats = kinds & {GGMLQuantizationType.F32.name}
    odd = sorted((kinds - floats) & set(NATIVE_NAMES))  # F16, BF16 rows of a width not a multiple of 32
    others = sorted(kinds - floats - set(odd))
    why = [f"{', '.join(others)} {'is' if len(others) == 1 else 'are'} not a kind the kernel reads "
           f"(it reads {', '.join(NATIVE_NAMES)})"] if others else []
    why += [f"{', '.join(odd)} rows not whole 32s of weights"] if odd else []
    return "; ".join(why + (["F32 is float32 already"] if floats else []))


def dense_note(path: Path, layout: GgufLayout) -> str | None:
    """The one line a native load says where some of a file's weights load as float32 copies (None: none
    do): how many, in which kinds, why, and what the kernel reads."""
    dense = [t for t in weights_of(layout.tensors) if not read_as_blocks(t)]
    if not dense:
        return None
    return (f"{path.name}: {len(dense)} weights load as float32 copies, not native blocks: {_census(dense)}: "
            f"{_why_dense({t.kind.name for t in dense})}")


def print_verdicts(files: list[Path]) -> int:
    """`specdraft models FILE.gguf ...`: each file's lines (`describe`), every path checked to be a file first."""
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path} is not a file: give the path of a .gguf model file")
    for path in files:
        print("\n".join(describe(path)))
    return 0


def describe(path: Path) -> list[str]:
    """Lines saying whether `path` loads here and how its weights run (the module docstring)."""
    try:
        layout = check_gguf(path)
    except BadModelFileError as exc:
        return [f"{path}: does not load: {exc.problem}"]
    weights = weights_of(layout.tensors)
    blocks = [t for t in weights if read_as_blocks(t)]
    dense = [t for t in weights if not read_as_blocks(t)]
    lines = [f"{path}: {layout.architecture}, {len(weights)} weight tensors"]
    if blocks:
        lines.append(f"  read as the file's blocks: {_census(blocks)}")
    if dense:
        lines.append(f"  loaded as float32 copies: {_census(dense)}: {_why_dense({t.kind.name for t in dense})}")
    problem = native_problem(path, torch.device("cpu"), torch.float32)
    if problem is not None:
        lines.append(f"  natively: no, not on this machine: {problem}")
    elif not blocks:
        lines.append("  natively: no: none of its weights is in a kind the kernel reads")
    else:
        lines.append("  natively: yes" if not dense else
                     "  natively: partly: the float32 copies above run dense (more memory a token, slower)")
    return lines
