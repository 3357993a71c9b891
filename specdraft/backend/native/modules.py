"""Torch modules over GGUF blocks: `BlockLinear` (a linear layer, with a float32 bias or none) and `BlockEmbedding` (a
token embedding, whose blocks a tied output layer shares). A `BlockLinear` computes in one of two
arithmetics (`ARITHMETICS`): float32, the dense layer's (called as a module it dequantises,
`dense_values`, and computes as the dense module does, so a long pass gives the dense pass's result
too), or int8 (each token quantised in blocks of 32 and integer dot products, `csrc/int8.cpp`; on
CPU, by the kernel, called as a module too). A compiled CPU step reads their blocks in place
(`numba_layers`) in the same arithmetic."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from specdraft.backend.native.formats import KINDS, NAMES, dequantize
from specdraft.backend.native.calls import expand, project_native
from specdraft.backend.native.library import TILE_ROWS, kernel, kernel_problem
from specdraft.backend.native.pages import huge_page_buffer
from specdraft.backend.native.readers import Reader, Storage, reader
from specdraft.backend.linear import few_rows_linear


def dense_values(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """`dequantize`'s values: by the compiled kernel where it reads blocks (`reader`; a pass over
    the blocks on every thread), else by torch."""
    if reader([Storage.BLOCKS], blocks.device) is not Reader.KERNEL:
        return dequantize(blocks, kind, width)
    out = torch.empty(blocks.shape[0], width)
    expand(blocks.contiguous().numpy(), kind, out.numpy(), kernel().expand_address)
    return out


ARITHMETICS = ("float32", "int8")  # how a `BlockLinear` computes


class BlockLinear(torch.nn.Module):
    """A linear layer whose weight is GGUF blocks [out, row bytes] (a buffer, `blocks`), plus `bias`
    [out] (a parameter, as the dense layer's; or None), computing in `arithmetic` (`ARITHMETICS`). As
    a module, float32 dequantises and runs `FewRowsLinear`'s arithmetic, the dense layer's result; int8 runs the kernel's int8 arithmetic
    (float32 activations on CPU; elsewhere it dequantises, as float32). In the int8 arithmetic the
    blocks are held as the kernel's tiles (`Kernel.tile`: the same bytes, 16 rows interleaved; F16's and
    BF16's weights 8 rows)."""

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int, arithmetic: str = "float32",
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        assert blocks.dtype == torch.uint8 and blocks.shape[1] == KINDS[kind].row_bytes(in_features)
        assert arithmetic in ARITHMETICS, arithmetic
        assert bias is None or tuple(bias.shape) == (blocks.shape[0],), "a bias of one value per output row"
        self.in_features, self.out_features, self.kind = in_features, blocks.shape[0], kind
        self.arithmetic = arithmetic
        self.register_buffer("blocks", blocks)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def dense(self) -> torch.Tensor:
        """The float32 weight [out, in] these blocks hold."""
        if self.arithmetic == "int8":
            return torch.from_numpy(kernel().tile_values(self.blocks.numpy(), self.kind, self.in_features,
                                                         np.arange(self.out_features)))
        return dense_values(self.blocks, self.kind, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.arithmetic == "int8" and x.device.type == "cpu" and x.dtype == torch.float32:
            rows = x.detach().reshape(-1, self.in_features).contiguous()
            out = torch.empty(rows.shape[0], self.out_features)
            bias = np.zeros(self.out_features, np.float32) if self.bias is None else self.bias.detach().float().numpy()
            weights = (self.blocks.numpy(), _NONE, bias, self.kind)
            project_native(weights, rows.numpy(), out.numpy(), _NO_ROWS, kernel().calls("int8"))
            return out.reshape(*x.shape[:-1], self.out_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return few_rows_linear(x, self.dense().to(x.dtype), bias)  # as `FewRowsLinear`, call for call

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {NAMES[self.kind]} blocks, "
                f"bias={self.bias is not None}, {self.arithmetic} arithmetic")


_NONE, _NO_ROWS = np.zeros(0, np.float32), np.zeros((0, 0), np.float32)  # no scales; no residual


class BlockEmbedding(torch.nn.Module):
    """A token embedding read from GGUF blocks (shared with a tied `BlockLinear` output layer; held as
    its tiles where that layer computes in int8: `tiled`); `scale`: what the rows are multiplied by,
    where the embedding it replaces scaled them (Gemma's: sqrt(hidden), in the weights' dtype)."""

    def __init__(self, blocks: torch.Tensor, kind: int, embedding_dim: int, scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.kind = blocks.shape[0], embedding_dim, kind
        self.tiled = False
        self.register_buffer("blocks", blocks)
        self.scale = None if scale is None else scale.detach().to(torch.float32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tiled:
            rows = torch.from_numpy(kernel().tile_values(self.blocks.numpy(), self.kind, self.embedding_dim,
                                                         ids.reshape(-1).numpy()))
        else:
            rows = dense_values(self.blocks[ids.reshape(-1)], self.kind, self.embedding_dim)
        if self.scale is not None:
            rows = rows * self.scale
        return rows.reshape(*ids.shape, self.embedding_dim)


def int8_problem(model: torch.nn.Module) -> str | None:
    """Why `model`'s block layers cannot compute in the int8 arithmetic (None: they can): it runs on
    CPU by the compiled kernel, over tiles of 16 rows (the last may have 8)."""
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    if not layers:
        return "the model has no GGUF-block layers"
    if any(m.blocks.device.type != "cpu" for m in layers):
        return "the int8 arithmetic runs on CPU"
    odd = next((m for m in layers if m.out_features % TILE_ROWS), None)
    if odd is not None:
        return f"a layer has {odd.out_features} output rows, not a multiple of {TILE_ROWS}"
    problem = kernel_problem()
    return None if problem is None else f"the block kernel is not available here: {problem}"


def use_arithmetic(model: torch.nn.Module, arithmetic: str) -> int:
    """Set the arithmetic (`ARITHMETICS`) of every `BlockLinear` in `model` (int8: once, its blocks
    rearranged into tiles, a tied embedding's with them; refused where `int8_problem` says why);
    return how many. The tiles lie in one `huge_page_buffer`, in the order of the model's modules (the
    order a step reads them: a CPU step's `on_huge_pages` then leaves them where they are), and the
    blocks they were made from are dropped (a file's mapped pages, or a copy)."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, got {arithmetic!r}")
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    if all(m.arithmetic == arithmetic for m in layers):
        return len(layers)
    if any(m.arithmetic == "int8" for m in layers):
        raise ValueError("a model's blocks are tiled for the int8 arithmetic once; load it again for float32")
    problem = int8_problem(model)
    if problem is not None:
        raise ValueError(f"the int8 arithmetic cannot run here: {problem}")
    first: dict[int, BlockLinear] = {}  # blocks -> the first layer reading them (a tied layer's blocks once)
    for m in layers:
        first.setdefault(m.blocks.data_ptr(), m)
    # One storage: tiles that lie one after another (q/k/v, gate/up) are read as one joined view.
    buffer = torch.from_numpy(huge_page_buffer(sum(m.blocks.numel() for m in first.values())))
    offset, tiled = 0, {}
    for address, m in first.items():
        tiles = buffer[offset : offset + m.blocks.numel()].view(m.blocks.shape)
        tiles._on_huge_pages = True
        tiled[address] = tiles
        offset += m.blocks.numel()
    # Each layer's tiles written by the kernel (which releases the GIL) on the step's threads, the largest
    # first: the time goes to faulting in the file's pages and the buffer's, which threads share.
    order = sorted(first, key=lambda address: -first[address].blocks.numel())
    tile = kernel().tile
    with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
        list(pool.map(lambda address: tile(first[address].blocks.numpy(), first[address].kind, tiled[address].numpy()),
                      order))
    for m in model.modules():
        if isinstance(m, (BlockLinear, BlockEmbedding)) and m.blocks.data_ptr() in tiled:
            m.blocks = tiled[m.blocks.data_ptr()]
            if isinstance(m, BlockEmbedding):
                m.tiled = True
            else:
                m.arithmetic = arithmetic
    return len(layers)
