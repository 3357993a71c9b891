"""`WeightOnlyInt8Linear`: a linear layer with int8 weights (per output channel scales) and activations
as they come, for draft copies of a model (`use_weight_only_int8`), made from float linears or layers
of GGUF blocks alike. (Not the int8 arithmetic of `native`, which quantises the activations too and
keeps the GGUF blocks: `native.modules.ARITHMETICS`.)"""

from __future__ import annotations

import torch

from specdraft.backend.native import BlockLinear
from specdraft.backend.linear import FewRowsLinear, few_rows_linear, replace_linears


class WeightOnlyInt8Linear(torch.nn.Module):
    """Weight-only int8 linear layer (per output channel scales) for draft copies of a model.

    A draft step reads every weight once, so a quarter of the bytes is most of the speed. On CPU a
    pass of a few tokens reads these weights in numba's kernels (float32 activations,
    `numba_layers`); called as a module (prefill, larger passes) it dequantises into the activations'
    dtype and multiplies as `FewRowsLinear` does (a row's result the same whatever rows are beside it),
    except bf16 activations on CPU, which run `torch._weight_int8pack_mm` (the int8 kernel gpt-fast
    and torchao use, which computes each row on its own). Outputs are in the activations' dtype. Only
    for drafts: results differ from the full-precision layer (that is what verification is for).
    """

    def __init__(self, linear: torch.nn.Module) -> None:
        """linear: an `nn.Linear`, `FewRowsLinear` or `BlockLinear` (its blocks dequantised)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        source = linear.dense() if isinstance(linear, BlockLinear) else linear.weight
        weight = source.detach().float()  # [out, in]
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
        self.register_buffer("weight", torch.round(weight / scales[:, None]).to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16 if weight.device.type == "cpu" else source.dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [n, in]
        if rows.device.type == "cpu" and rows.dtype == torch.bfloat16:
            out = torch._weight_int8pack_mm(rows.contiguous(), self.weight, self.scales)
        else:
            out = few_rows_linear(rows, self.weight.to(rows.dtype), None) * self.scales.to(rows.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def use_weight_only_int8(model: torch.nn.Module) -> int:
    """Replace every plain `nn.Linear`, `FewRowsLinear` and `BlockLinear` in `model` by a
    `WeightOnlyInt8Linear`; return how many. For a draft copy that its builder owns (the copy stops
    referring to the full-precision weights)."""
    return replace_linears(model, WeightOnlyInt8Linear, (torch.nn.Linear, FewRowsLinear, BlockLinear))
