"""Load a model as `plan.plan_load` planned it: the embedded SmolLM2-135M-Instruct GGUF (default), a
`.gguf` file, a local Hugging Face directory, or a hub id already in the local cache, as `find.resolve`
finds them (a name `specdraft models` lists is fetched and verified there).

A GGUF read natively (`weights="native"`) loads from the file itself: its blocks in place of the
linear layers, the rest (norms, biases, kinds the kernel does not read) dequantised from it as
transformers would; only its config, generation config and tokenizer are cached, once, under the
cache dir (`SPECDRAFT_CACHE_DIR`, default `~/.cache/specdraft`; `gguf_cache`). A GGUF read dense is
dequantised whole by transformers (tens of seconds), so it is converted once into safetensors +
tokenizer files there, and later loads read that. Either way a GGUF's Llama 3.x rotary factors
(`rope_freqs`), which transformers' conversion leaves out, are applied to the model's rotary
frequencies (`_use_rope_freqs`). An int8 copy of a loaded model (`int8_copy`) is made here too.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import numpy as np
import torch

from specdraft.backend import native as blocks
from specdraft.backend.family import Family, family_of
from specdraft.backend.linear import use_few_rows_linears
from specdraft.backend.native.gguf_file import GgufTensor, dense_tensor, gguf_blocks, read_gguf, use_blocks
from specdraft.backend.native.layout import GgufLayout
from specdraft.backend.weight_only_int8 import use_weight_only_int8
from specdraft.errors import ModelNotFoundError
from specdraft.models.gguf_cache import cache_gguf_config, convert_gguf, gguf_tokenizer, lean_tokenizer
from specdraft.models.fused import unfuse
from specdraft.models.gguf_check import ROPE_FREQS, check_gguf
from specdraft.models.long_rope import use_context
from specdraft.models.loaded import LoadedModel, model_device
from specdraft.models.plan import Loading, plan_load
from specdraft.models.verdict import dense_note

log = logging.getLogger("specdraft")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _from_pretrained(source, dtype: torch.dtype, local_only: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = lean_tokenizer(AutoTokenizer.from_pretrained(source, local_files_only=local_only))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_only)
    return tokenizer, model


def _native_from_gguf(gguf: Path, layout: GgufLayout):
    """(tokenizer, model) for a GGUF whose quantised layers (the kinds of `native.KINDS`) are read as its blocks, built from the file
    alone: the model's skeleton on the meta device (from the cached config, `cache_gguf_config`), the
    file's blocks swapped in (`use_blocks`), then what is left (norms, biases, layers of other kinds)
    read dense from the file (`_left_over`). None where the model is not of a family our forward runs,
    or the file lacks a tensor it needs."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    source = cache_gguf_config(gguf)
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    family = family_of(config)
    if family is None:
        return None
    tensors = read_gguf(gguf, layout, family)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    unfuse(model, family)  # as the file's fused tensors are read: each part its own module
    model.tie_weights()  # as loading would: a tied output layer is the embedding, and follows its blocks
    if use_blocks(model, gguf_blocks(tensors, family), family) == 0:
        return None
    state = _left_over(model, tensors, family)
    if state is None:
        return None
    model.load_state_dict(state, strict=False, assign=True)
    model.generation_config = GenerationConfig.from_pretrained(source, local_files_only=True)
    return gguf_tokenizer(source), model


def _left_over(model: torch.nn.Module, tensors: dict[str, GgufTensor], family: Family) -> dict | None:
    """The state of `model`'s tensors still on the meta device, read dense from the file
    (`dense_tensor`): one tensor for all the names it goes by (a tied output layer's weight is the
    embedding's). None where the file lacks one."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    aliases: dict[int, list[str]] = {}
    for name, tensor in named:
        if tensor.is_meta:
            aliases.setdefault(id(tensor), []).append(name)
    kinds = {id(tensor): isinstance(tensor, torch.nn.Parameter) for _, tensor in named}
    state = {}
    for key, names in aliases.items():
        stored = next((name for name in names if name in tensors), None)
        if stored is None:
            return None
        value = dense_tensor(tensors, stored, family)
        state.update(dict.fromkeys(names, torch.nn.Parameter(value, requires_grad=False) if kinds[key] else value))
    return state


def load_model(
    spec: str | None = None,
    device: torch.device | str | None = None,
    dtype: str = "auto",
    few_rows_linears: bool | None = None,
    weights: str = "auto",
    arithmetic: str = "auto",
) -> LoadedModel:
    """Load a target or draft model for decoding, each choice made by `plan_load`. `few_rows_linears`
    (default: on CPU) swaps its linear layers for `FewRowsLinear`, which keeps decode and verify steps
    fast on CPU; False gives the stock Hugging Face model (what the benchmark's peers run). `weights`:
    a GGUF's quantised layers (`native.KINDS`) as its blocks ("native") or as float ("dense"); the same logits either
    way. `arithmetic`: what native weights compute in, "int8" (each token quantised in blocks of 32,
    integer dot products) or "float32" (the dense model's logits, bitwise)."""
    return load(plan_load(spec, device, dtype, weights, arithmetic, few_rows_linears=few_rows_linears))


def load(loading: Loading) -> LoadedModel:
    """Load a model as `loading` says (`plan_load`)."""
    gguf = loading.gguf
    # A bad file is refused by name before transformers or the kernel reads it.
    layout = check_gguf(gguf) if gguf is not None else None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    native = loading.weights == "native"
    note = dense_note(gguf, layout) if native else None
    if note is not None:  # said before anything is read or compiled
        log.warning(note)
    built = _native_from_gguf(gguf, layout) if native else None
    source = gguf if built is not None else convert_gguf(gguf) if gguf is not None else loading.source
    tokenizer, model = built or _dense_from_pretrained(loading.source, source, loading.dtype)
    if built is None and (family := family_of(model.config)) is not None:
        unfuse(model, family)  # Phi-3's q/k/v and gate/up as the modules every path reads (built: split already)
    if layout is not None:
        _use_rope_freqs(model, gguf, layout)
    model.to(loading.device).eval()
    model.requires_grad_(False)
    use_context(model)  # LongRoPE: the short factors, until a runtime serves more (`long_rope`)
    if native and built is None:  # loaded dense after all: read the blocks now
        native = blocks.use_gguf_blocks(model, gguf) > 0
    computes = _use_int8(model, loading.int8_asked) if native and loading.arithmetic == "int8" else "float32"
    if loading.few_rows_linears:
        use_few_rows_linears(model)
    eos = model.generation_config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids += (tokenizer.eos_token_id,)
    max_context = int(getattr(model.config, "max_position_embeddings", 2048))
    path = Path(source) if isinstance(source, Path) else Path(str(source))
    return LoadedModel(model, tokenizer, loading.name, path, max_context, eos_ids, loading.few_rows_linears,
                       weights="native" if native else "dense", arithmetic=computes)


def _use_rope_freqs(model: torch.nn.Module, gguf: Path, layout: GgufLayout) -> None:
    """Divide the model's rotary frequencies by the GGUF's `rope_freqs` factors, where it has them.

    llama.cpp's converter writes a Llama 3.x model's llama3 rope scaling (its HF config's factor, low
    and high frequency factors and original context) as one float32 factor per pair of a head's
    dimensions, and llama.cpp rotates pair i at base^(-2i/d) / rope_freqs[i]. Transformers' GGUF
    config has no rope scaling, so the model's rotary module holds base^(-2i/d) alone; without the
    factors every position past the first would be rotated wrong. They are set here, on the module's
    `inv_freq` (and `original_inv_freq`, what a reset restores), from which every path (eager, numba,
    native, inductor, Triton) takes its cos and sin. `check_gguf` has checked their kind and count."""
    info = next((t for t in layout.tensors if t.name == ROPE_FREQS), None)
    if info is None:
        return
    factors = torch.from_numpy(np.fromfile(gguf, "<f4", info.shape[0], offset=layout.data_start + info.offset))
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "default", f"the rotary frequencies are scaled already ({rotary.rope_type})"
    plain = rotary.original_inv_freq  # [head_dim / 2]: base^(-2i/d)
    assert plain.shape == factors.shape, (tuple(plain.shape), tuple(factors.shape))
    scaled = plain.float() / factors
    with torch.no_grad():
        rotary.inv_freq.copy_(scaled)
        rotary.original_inv_freq.copy_(scaled)


def _dense_from_pretrained(spec: Path | str, source: Path | str, dtype: torch.dtype):
    """(tokenizer, model) from a directory or the Hugging Face cache; from the hub only where `source`
    is a hub id and we are not offline."""
    try:
        # Local files first: a model already on disk never touches the network.
        return _from_pretrained(source, dtype, local_only=True)
    except OSError as exc:
        if isinstance(source, Path):
            raise ModelNotFoundError(f"model {str(spec)!r} could not be loaded from {source}: "
                                     f"{_first_line(exc)}") from None
        if _offline():
            raise ModelNotFoundError(
                f"model {str(spec)!r} not found: not a local directory or .gguf file, not in the Hugging Face cache, "
                "and no hub download attempted (offline: HF_HUB_OFFLINE=1)"
            ) from None
    try:
        return _from_pretrained(source, dtype, local_only=False)
    except OSError as exc:
        raise ModelNotFoundError(
            f"model {str(spec)!r} not found locally or in the Hugging Face cache, and the hub download failed: "
            f"{_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _use_int8(model: torch.nn.Module, asked: bool) -> str:
    """Set a native model's layers to the int8 arithmetic where they can take it (`blocks.int8_problem`):
    "int8", else "float32" (chosen) or an error saying why (asked for)."""
    problem = blocks.int8_problem(model)
    if problem is not None and asked:
        raise ValueError(f"--arithmetic int8: {problem}")
    computes = "float32" if problem is not None else "int8"
    blocks.use_arithmetic(model, computes)
    return computes


def release_freed_memory() -> bool:
    """Hand the memory that loading freed back to the system (glibc's `malloc_trim`: the transient
    float32 weights an int8 draft copy is made from, ~160-240 MB for the embedded model, otherwise
    stay resident as free heap). Returns whether it could (False where the C library has no such
    call)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return False
    trim(0)
    return True


def int8_copy(target: LoadedModel) -> LoadedModel:
    """A draft copy of the target with int8 weights in every linear layer (the output layer too).

    It shares the target's embeddings, norms and rotary tables instead of copying them, and holds no
    full-precision linear weights: a quarter of the bytes a step reads. On CPU it computes in float32 (numba's kernels read the int8 weights
    directly, `backend.numba_layers`).
    """
    shared = {id(t): t for t in list(target.model.parameters()) + list(target.model.buffers())}
    model = copy.deepcopy(target.model, memo=shared)  # new modules over the same tensors
    use_weight_only_int8(model)
    device = model_device(target)
    dtype = torch.float32 if device.type == "cpu" else next(target.model.parameters()).dtype
    return LoadedModel(model, target.tokenizer, f"{target.name} (int8 copy)", target.path, target.max_context,
                       target.eos_token_ids, few_rows_linears=False, compute_dtype=dtype, target_copy=True)


