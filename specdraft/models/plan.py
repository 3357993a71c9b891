"""How a model loads, every choice made once before anything heavy is read: `plan_load` resolves a
model argument (`find.resolve`), the device and dtype, whether a GGUF's quantised layers are read as
its blocks (`native_problem` says why not) and what they compute in, into a `Loading`; `plan_draft`
plans the model drafter's model by the target's rules (`DraftPlan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft.backend import native as blocks
from specdraft.models.find import SELF_DRAFT, resolve
from specdraft.models.loaded import LoadedModel
from specdraft.params import ARITHMETIC, WEIGHTS


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of auto, {', '.join(dtypes)}; got {name!r}")
    return dtypes[name]


def native_problem(gguf: Path | None, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a model cannot load native weights (its quantised layers, the kinds of `native.KINDS`, read as the GGUF's blocks, on CPU
    in float32, by the kernel compiled here), or None where it can."""
    if gguf is None:
        return "the model is not a GGUF file"
    if device.type != "cpu":
        return f"native weights run on CPU, not {device.type}"
    if dtype != torch.float32:
        return f"native weights compute in float32, not {str(dtype).removeprefix('torch.')}"
    if blocks.reader([blocks.Storage.BLOCKS], device) is not blocks.Reader.KERNEL:
        return f"the block kernel is not available here: {blocks.kernel_problem()}"
    return None


@dataclass(frozen=True)
class Loading:
    """How a model loads, every choice made (`plan_load`): what it is, where it runs and in what dtype,
    whether a GGUF's quantised layers (`native.KINDS`) are read as the file's blocks and what they compute in."""

    name: str  # as it is shown
    source: Path | str  # a .gguf file, a Hugging Face directory, or a hub id
    device: torch.device
    dtype: torch.dtype
    weights: str  # "native": the GGUF's blocks (`backend.native`); "dense": float tensors
    arithmetic: str  # "int8" (native weights only) or "float32"
    few_rows_linears: bool  # its linear layers become `FewRowsLinear`s (fast decode and verify steps on CPU)
    int8_asked: bool = False  # int8 was asked for, not chosen: layers that cannot take it are an error, not float32

    @property
    def gguf(self) -> Path | None:
        return self.source if isinstance(self.source, Path) and self.source.suffix == ".gguf" else None


def plan_load(spec: str | None = None, device: torch.device | str | None = None, dtype: str = "auto",
              weights: str = "auto", arithmetic: str = "auto", eager: bool = False,
              few_rows_linears: bool | None = None) -> Loading:
    """Every choice of how a model loads, made here once (the library's, the CLI's and the server's
    through `Settings.resolve`). device: default cuda where present, else cpu; dtype auto: float32 on
    CPU, bfloat16 on CUDA. weights (`WEIGHTS`): auto is native where it applies (`native_problem`)
    unless `eager` (eager layers would dequantise every block at every pass), dense otherwise; native
    where it does not apply is an error saying why. arithmetic (`ARITHMETIC`): auto is int8 on native
    weights, float32 otherwise; int8 without native weights is an error saying why. few_rows_linears:
    default on CPU."""
    for option, value, choices in (("weights", weights, WEIGHTS), ("arithmetic", arithmetic, ARITHMETIC)):
        if value not in choices:
            raise ValueError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    try:
        device = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu or cuda (cuda:N for the Nth GPU), got {device!r}") from None
    torch_dtype = resolve_dtype(dtype, device)
    name, source = resolve(spec)
    gguf = source if isinstance(source, Path) and source.suffix == ".gguf" else None
    dense = "the weights asked for are dense" if weights == "dense" else native_problem(gguf, device, torch_dtype)
    if dense is not None and weights == "native":
        raise ValueError(f"--weights native: {dense}")
    if dense is None and weights == "auto" and eager:
        dense = "enforce_eager reads the weights dense"
    if dense is not None and arithmetic == "int8":
        raise ValueError(f"--arithmetic int8 computes on a GGUF's blocks read natively: {dense}")
    few_rows = device.type == "cpu" if few_rows_linears is None else few_rows_linears
    return Loading(name, source, device, torch_dtype, "dense" if dense else "native",
                   "int8" if dense is None and arithmetic != "float32" else "float32", few_rows, arithmetic == "int8")


DraftPlan = Loading | LoadedModel | str  # how the model drafter's model loads (`plan_draft`)


def plan_draft(spec: str | LoadedModel | None, device: torch.device, dtype: str = "auto", weights: str = "auto",
               arithmetic: str = "auto", eager: bool = False) -> DraftPlan:
    """How the model drafter's model loads, by the target's rules (`Settings.resolve`): `self-int8` (or
    None) for an int8 copy of the target (`SELF_DRAFT`, made from the loaded target); a model given
    loaded, as it is; anything else as `plan_load` plans a model, on the target's device, with the
    settings' dtype, weights, arithmetic and eagerness."""
    if spec is None or spec == SELF_DRAFT:
        return SELF_DRAFT
    if isinstance(spec, LoadedModel):
        return spec
    return plan_load(spec, device, dtype, weights, arithmetic, eager=eager)


