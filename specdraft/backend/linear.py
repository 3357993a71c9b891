"""`FewRowsLinear`, the linear layer models are loaded with on CPU (same results as `nn.Linear`): a
linear layer that stays fast for the few rows a decode or verify step feeds it.

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
    return replace_linears(model, FewRowsLinear, (torch.nn.Linear,))


def replace_linears(model: torch.nn.Module, make, kinds: tuple[type, ...]) -> int:
    """Replace every child of exactly one of these types by `make(child)`; return how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) in kinds]
    for parent, name, child in swaps:
        setattr(parent, name, make(child))
    return len(swaps)
