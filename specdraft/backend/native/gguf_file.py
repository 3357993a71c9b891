"""A GGUF's tensors, memory-mapped (where the layout `models.gguf_check.check_gguf` returns,
`layout.GgufLayout`, says they lie, or by gguf's reader), by the names transformers
gives them (`read_gguf`), for the families our forward runs (`backend.family`; llama.cpp names their
tensors alike). Those of the kinds the kernel reads (`formats.KINDS`) are read as blocks (`gguf_blocks`)
and swapped into a model (`use_blocks`); the rest (norms, biases, other kinds) are read dense
(`dense_tensor`), each the float32 tensor transformers' own GGUF loader makes of it, bitwise: gguf's
dequantisation, then q and k rows put back in transformers' order where a family's file interleaves them
(`Family.gguf_interleaved_qk`: Llama's does, Qwen2's holds transformers' order)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from specdraft.backend.family import FAMILIES, Family, family_of
from specdraft.backend.native.formats import kind_of
from specdraft.backend.native.layout import GgufLayout, TensorInfo
from specdraft.backend.native.modules import BlockEmbedding, BlockLinear

_TOP = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file: its type and its data, [*rows, row] (GGUF's shape reversed, as gguf's
    reader gives it; a row in bytes, uint8, or F32/F16 values), memory-mapped."""

    kind: GGMLQuantizationType
    data: np.ndarray

    def values(self) -> np.ndarray:
        """float32 [*rows, row length]: gguf's own dequantisation (F32 as it lies), as transformers calls it."""
        from gguf.quants import dequantize

        return dequantize(self.data, self.kind)


def transformers_name(name: str, modules: tuple[tuple[str, str], ...] = ()) -> str | None:
    """A GGUF tensor's name in a Llama-architecture transformers model (`blk.3.attn_q.bias` ->
    `model.layers.3.self_attn.q_proj.bias`), as transformers' GGUF loader maps it; None for others.
    modules: a family's own (`FileFamily.modules`: part -> module), where they differ from Llama's."""
    stem, _, what = name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        module = dict(modules).get(part) or _LAYER.get(part)
        return None if module is None else f"model.layers.{layer}.{module}.{what}"
    module = _TOP.get(stem)
    return None if module is None else f"{module}.{what}"


def read_gguf(gguf: Path, layout: GgufLayout | None = None, family: Family | None = None) -> dict[str, GgufTensor]:
    """A GGUF's tensors by their transformers names (`transformers_name`, with the family's modules;
    others left out; a fused tensor split into its parts' rows, `Family.fused`), memory-mapped where
    `layout` (`check_gguf`'s: the header and tensor infos parsed once) says they lie; without one, as
    gguf's reader finds them (the same arrays, slower: it parses every metadata value)."""
    modules = () if family is None else FAMILIES[family.model_type].file.modules
    if layout is None:
        from gguf import GGUFReader

        # each as bytes, as the layout's (gguf gives F32, F16 tensors as their values)
        found = [(t.name, t.tensor_type, np.asarray(t.data).view(np.uint8)) for t in GGUFReader(str(gguf)).tensors]
    else:
        found = [(info.name, info.kind, _bytes(gguf, layout.data_start, info)) for info in layout.tensors]
    named = {name: GgufTensor(kind, data) for raw, kind, data in found
             if (name := transformers_name(raw, modules)) is not None}
    return named if family is None or not family.fused else _split(named, family)


def _split(tensors: dict[str, GgufTensor], family: Family) -> dict[str, GgufTensor]:
    """The tensors with each fused one (`Family.fused`: `...qkv_proj.weight`) as its parts' (`...q_proj.weight`,
    `...k_proj.weight`, `...v_proj.weight`), each a view of its rows."""
    out = {}
    for name, tensor in tensors.items():
        stem, _, what = name.rpartition(".")
        fused = next((f for f in family.fused if stem.endswith(f".{f.module}")), None)
        if fused is None:
            out[name] = tensor
            continue
        parent, start = stem.rpartition(".")[0], 0
        for part, rows in zip(fused.parts, family.part_rows(fused, tensor.data.shape[0])):
            out[f"{parent}.{part}.{what}"] = GgufTensor(tensor.kind, tensor.data[start : start + rows])
            start += rows
        assert start == tensor.data.shape[0], (name, start, tensor.data.shape)
    return out


def _bytes(gguf: Path, data_start: int, info: TensorInfo) -> np.ndarray:
    """A tensor's bytes in the file (`info`: its `layout.TensorInfo`), uint8 [*rows, row bytes],
    mapped on their own: a tensor's pages leave the process with the last view of it (a file mapped
    whole stays mapped, and resident, while any one tensor of it is used). Private: writable arrays
    (torch's), the file never written."""
    weights, size = GGML_QUANT_SIZES[info.kind]
    shape = (*reversed(info.shape[1:]), info.shape[0] // weights * size)
    return np.memmap(gguf, np.uint8, mode="c", offset=data_start + info.offset, shape=shape)


def rotary_order(rows: int, heads: int) -> np.ndarray:
    """The row order transformers gives a GGUF's q (k) weight: llama.cpp stores each head's rotary
    halves interleaved; transformers' `_reverse_permute_weights` undoes that, row by row."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(-1)


def _in_model_order(name: str, rows: np.ndarray, family: Family) -> np.ndarray:
    """A tensor's rows [rows, ...] in transformers' order: a q (k) weight or bias put back where the
    family's files interleave them."""
    module = name.rsplit(".", 2)[-2]
    if not family.gguf_interleaved_qk or module not in ("q_proj", "k_proj"):
        return rows
    return rows[rotary_order(rows.shape[0], family.heads if module == "q_proj" else family.kv_heads)]


def dense_tensor(tensors: dict[str, GgufTensor], name: str, family: Family) -> torch.Tensor:
    """The float32 tensor transformers' GGUF loader gives the weight `name` (`read_gguf`'s), bitwise:
    dequantised by gguf, in transformers' row order, a norm's less the family's offset (Gemma's
    files hold weight + 1), a copy."""
    values = _in_model_order(name, tensors[name].values(), family)
    if family.norm_offset and name.endswith("norm.weight"):
        values = values - np.float32(family.norm_offset)
    return torch.from_numpy(np.array(values, np.float32))


def gguf_blocks(tensors: dict[str, GgufTensor], family: Family) -> dict[str, tuple[np.ndarray, int]]:
    """Every weight of a linear layer or the embedding (`read_gguf`'s) the kernel reads as blocks (`kind_of`), by its
    transformers name: (blocks [rows, row bytes] uint8 in transformers' row order, kind). Other
    types are left out (they stay dense), and so are biases and norms. An untied output layer is
    the file's `output.weight`."""
    out = {}
    for name, tensor in tensors.items():
        weights, size = GGML_QUANT_SIZES[tensor.kind]
        kind = kind_of(tensor.kind.name, tensor.data.shape[-1] // size * weights)
        if kind is not None and name.endswith(".weight") and "norm" not in name:
            out[name] = (_in_model_order(name, tensor.data, family), kind)
    return out


def use_gguf_blocks(model: torch.nn.Module, gguf: Path) -> int:
    """Swap `model`'s linear layers (and its embedding, and a tied output layer) whose GGUF tensors
    are of a kind in `KINDS` for modules over the file's blocks (`use_blocks`); none where the model
    is not of a family our forward runs (`family_of`: it stays dense)."""
    family = family_of(model.config)
    if family is None:
        return 0
    return use_blocks(model, gguf_blocks(read_gguf(gguf, family=family), family), family)


def use_blocks(model: torch.nn.Module, found: dict[str, tuple[np.ndarray, int]], family: Family) -> int:
    """Swap the modules named in `found` (a weight's name -> (blocks [rows, row bytes], kind), as
    `gguf_blocks` gives) for `BlockLinear`s (`BlockEmbedding`), over the blocks where they lie (a
    mapped file's pages: nothing is read until a step or `use_arithmetic` reads it; a copy where
    they are not writable), each keeping the module's own bias (the same tensor); a tied output
    layer (`family.tied_head`) follows the embedding. The dense weights they replace are dropped.
    Returns how many modules were swapped."""
    swapped = 0
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    assert tied == family.tied_head, f"the output layer is {'' if tied else 'not '}the embedding, unlike the config"
    if "model.embed_tokens.weight" in found:
        blocks, kind = found["model.embed_tokens.weight"]
        assert blocks.shape[0] == embedding.num_embeddings
        model.model.embed_tokens = BlockEmbedding(_tensor(blocks), kind, embedding.embedding_dim,
                                                  scale=getattr(embedding, "embed_scale", None))
        swapped += 1
        if tied and "lm_head.weight" not in found:
            model.lm_head = BlockLinear(model.model.embed_tokens.blocks, kind, embedding.embedding_dim)
            swapped += 1
    for name, (blocks, kind) in found.items():
        if name == "model.embed_tokens.weight":
            continue
        parent_name, _, child = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        assert blocks.shape[0] == old.out_features, name
        assert old.bias is None or tuple(old.bias.shape) == (old.out_features,), name
        bias = None if old.bias is None else old.bias.data
        setattr(parent, child, BlockLinear(_tensor(blocks), kind, old.in_features, bias=bias))
        swapped += 1
    return swapped


def _tensor(blocks: np.ndarray) -> torch.Tensor:
    """Blocks as a tensor over the same memory, or over a copy where they are not writable (gguf's reader maps files read-only)."""
    return torch.from_numpy(blocks if blocks.flags.writeable else blocks.copy())
