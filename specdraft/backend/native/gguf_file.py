"""A GGUF's tensors of the kinds the kernel reads (`formats.KINDS`) read as blocks (`gguf_blocks`, in
transformers' names and row order) and swapped into the model transformers loaded from the same file
(`use_blocks`), for the families our forward runs (`backend.family`; llama.cpp names their tensors
alike; Qwen2's q/k/v biases are float32 tensors that stay with the model, and its q and k rows are
stored in transformers' order, Llama's interleaved: `Family.gguf_interleaved_qk`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specdraft.backend.family import Family, family_of
from specdraft.backend.native.formats import KINDS
from specdraft.backend.native.modules import BlockEmbedding, BlockLinear

_READ = {kind.name: number for number, kind in KINDS.items()}  # the GGUF types read as blocks; the rest stay dense
_PARTS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def rotary_order(rows: int, heads: int) -> np.ndarray:
    """The row order transformers gives a GGUF's q (k) weight: llama.cpp stores each head's rotary
    halves interleaved; transformers' `_reverse_permute_weights` undoes that, row by row."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(-1)


def gguf_blocks(gguf: Path, family: Family) -> dict[str, tuple[np.ndarray, int]]:
    """Every weight of a GGUF of a kind in `KINDS`, by its transformers name: (blocks [rows, row bytes]
    uint8 in transformers' row order, kind: q and k rows put back where `family.gguf_interleaved_qk`).
    Other types are left out (they stay dense), and so are biases. An untied output layer is the
    file's `output.weight`."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    heads, kv_heads = family.heads, family.kv_heads
    out = {}
    for tensor in reader.tensors:
        kind = _READ.get(tensor.tensor_type.name)
        if kind is None:
            continue
        blocks = np.asarray(tensor.data)  # [rows, row bytes], memory-mapped
        name = tensor.name
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = (blocks, kind)
        elif name == "output.weight":
            out["lm_head.weight"] = (blocks, kind)
        elif name.startswith("blk."):
            _, layer, part, what = name.split(".")
            module = next((k for k, v in _PARTS.items() if v == part), None)
            if module is None or what != "weight":
                continue
            if family.gguf_interleaved_qk and part in ("attn_q", "attn_k"):
                blocks = blocks[rotary_order(blocks.shape[0], heads if part == "attn_q" else kv_heads)]
            group = "self_attn" if part.startswith("attn") else "mlp"
            out[f"model.layers.{layer}.{group}.{module}.weight"] = (blocks, kind)
    return out


def use_gguf_blocks(model: torch.nn.Module, gguf: Path) -> int:
    """Swap `model`'s linear layers (and its embedding, and a tied output layer) whose GGUF tensors
    are of a kind in `KINDS` for modules over the file's blocks (`use_blocks`); none where the model
    is not of a family our forward runs (`family_of`: it stays dense)."""
    family = family_of(model.config)
    return 0 if family is None else use_blocks(model, gguf_blocks(gguf, family), family)


def use_blocks(model: torch.nn.Module, found: dict[str, tuple[np.ndarray, int]], family: Family) -> int:
    """Swap the modules named in `found` (a weight's name -> (blocks [rows, row bytes], kind), as
    `gguf_blocks` gives) for `BlockLinear`s (`BlockEmbedding`), over copies of the blocks, each
    keeping the module's own bias (the same tensor); a tied output layer (`family.tied_head`)
    follows the embedding. The dense weights they replace are dropped. Returns how many modules
    were swapped."""
    swapped = 0
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    assert tied == family.tied_head, f"the output layer is {'' if tied else 'not '}the embedding, unlike the config"
    if "model.embed_tokens.weight" in found:
        blocks, kind = found["model.embed_tokens.weight"]
        assert blocks.shape[0] == embedding.num_embeddings
        model.model.embed_tokens = BlockEmbedding(torch.from_numpy(blocks.copy()), kind, embedding.embedding_dim)
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
        setattr(parent, child, BlockLinear(torch.from_numpy(blocks.copy()), kind, old.in_features, bias=bias))
        swapped += 1
    return swapped
