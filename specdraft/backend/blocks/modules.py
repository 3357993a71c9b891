"""Torch modules over GGUF blocks: `BlockLinear` (a linear layer, no bias) and `BlockEmbedding` (a
token embedding, whose blocks a tied output layer shares). Called as modules (prefill chunks, other
devices) they dequantise (`dense_values`) and compute as the dense modules do, so a long pass gives
the dense pass's result too; a compiled CPU step reads their blocks in place (`numba_layers`)."""

from __future__ import annotations

import torch

from specdraft.backend.blocks.format import BLOCK, BLOCK_BYTES, NAMES, dequantize
from specdraft.backend.blocks.cpp_kernel import expand, kernel
from specdraft.backend.blocks.readers import Reader, Storage, reader
from specdraft.backend.linear import few_rows_linear


def dense_values(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """`dequantize`'s values: by the compiled kernel where it reads blocks (`reader`; a pass over
    the blocks on every thread), else by torch."""
    if reader([Storage.BLOCKS], blocks.device) is not Reader.KERNEL:
        return dequantize(blocks, kind, width)
    out = torch.empty(blocks.shape[0], width)
    expand(blocks.contiguous().numpy(), kind, out.numpy(), kernel().expand_address)
    return out


class BlockLinear(torch.nn.Module):
    """A linear layer (no bias) whose weight is GGUF blocks [out, row bytes] (a buffer, `blocks`).
    As a module it dequantises and runs `FewRowsLinear`'s arithmetic, the dense layer's result."""

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int) -> None:
        super().__init__()
        assert blocks.dtype == torch.uint8 and blocks.shape[1] == in_features // BLOCK * BLOCK_BYTES[kind]
        self.in_features, self.out_features, self.kind = in_features, blocks.shape[0], kind
        self.register_buffer("blocks", blocks)
        self.bias = None

    def dense(self) -> torch.Tensor:
        """The float32 weight [out, in] these blocks hold."""
        return dense_values(self.blocks, self.kind, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return few_rows_linear(x, self.dense().to(x.dtype), None)  # as `FewRowsLinear`, call for call

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {NAMES[self.kind]} blocks"


class BlockEmbedding(torch.nn.Module):
    """A token embedding read from GGUF blocks (shared with a tied `BlockLinear` output layer)."""

    def __init__(self, blocks: torch.Tensor, kind: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.kind = blocks.shape[0], embedding_dim, kind
        self.register_buffer("blocks", blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dense_values(self.blocks[ids.reshape(-1)], self.kind, self.embedding_dim)
        return rows.reshape(*ids.shape, self.embedding_dim)
