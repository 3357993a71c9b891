"""Linear layers models are loaded with: `FewRowsLinear` (the target on CPU, same results as
`nn.Linear`) and `Int8Linear` (a draft copy of a model with int8 weights).

`FewRowsLinear`: a linear layer that stays fast for the few rows a decode or verify step feeds it.

A decode step multiplies 1 row by every weight matrix, a verify step k + 1 rows per request. On CPU,
torch's `F.linear` (x @ W.T) sends such skinny products down BLAS paths that read the weights far
slower than memory allows, while the same products written as (W @ x.T).T run near memory speed
(a single row is doubled: alone it would take a matrix-vector path as slow as F.linear's; see
`benchmarks/results/verify_cost.md`). Same products, summed in another order, so the results agree
to float rounding. Larger inputs (prefill) and other devices use `F.linear` unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # above this (prefill chunks) F.linear's path is the efficient one


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] times weight [out, in]: (W @ x.T).T for the few rows of a CPU step, F.linear
    otherwise (see above)."""
    rows = x.reshape(-1, weight.shape[1])  # [n, in]
    n = rows.shape[0]
    if n > MAX_ROWS or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    if n == 1:
        rows = rows.repeat(2, 1)
    out = (weight @ rows.T).T[:n].contiguous()  # [n, out]
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class FewRowsLinear(torch.nn.Module):
    """Wraps an `nn.Linear`'s parameters (shared, not copied); same state-dict keys and results."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [out, in]
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return few_rows_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_few_rows_linears(model: torch.nn.Module) -> int:
    """Replace every plain `nn.Linear` in `model` by a `FewRowsLinear` over the same parameters;
    return how many were replaced. For the loader, which owns the model it builds."""
    return _replace_linears(model, FewRowsLinear)


class Int8Linear(torch.nn.Module):
    """Weight-only int8 linear layer (per output channel scales) for draft copies of a model.

    A draft step reads every weight once, so a quarter of the bytes is most of the speed. On CPU a
    pass of a few tokens reads these weights in numba's kernels (float32 activations,
    `numba_layers`); called as a module (prefill, larger passes) it dequantises into the activations'
    dtype, except bf16 activations on CPU, which run `torch._weight_int8pack_mm` (the int8 kernel
    gpt-fast and torchao use). Outputs are in the activations' dtype. Only for drafts: results differ
    from the full-precision layer (that is what verification is for).
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        source = linear.dense() if hasattr(linear, "dense") else linear.weight  # GGUF blocks: dequantised
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
            out = F.linear(rows, self.weight.to(rows.dtype)) * self.scales.to(rows.dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def _replace_linears(model: torch.nn.Module, make, kinds: tuple[type, ...] = (torch.nn.Linear,),
                     blocks: bool = False) -> int:
    """Replace the children of these types (and, with `blocks`, layers of GGUF blocks: any with a
    `dense()` weight) by `make(child)`."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) in kinds or (blocks and hasattr(child, "blocks") and hasattr(child, "dense"))]
    for parent, name, child in swaps:
        setattr(parent, name, make(child))
    return len(swaps)


def use_int8_linears(model: torch.nn.Module) -> int:
    """Replace every plain `nn.Linear` (and layer of GGUF blocks, `blocks.BlockLinear`) in `model` by
    an `Int8Linear`; return how many. For a draft copy that its builder owns (the copy stops
    referring to the full-precision weights)."""
    return _replace_linears(model, Int8Linear, (torch.nn.Linear, FewRowsLinear), blocks=True)
