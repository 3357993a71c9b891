"""`FewRowsLinear`, the linear layer models are loaded with on CPU (same results as `nn.Linear`): a
linear layer that stays fast for the few rows a decode or verify step feeds it, and gives each row the
same result whatever rows are beside it.

A decode step multiplies 1 row by every weight matrix, a verify step k + 1 rows per request. On CPU,
torch's `F.linear` (x @ W.T) sends such skinny products down BLAS paths that read the weights far
slower than memory allows, while the same product written as (W @ x.T).T runs near memory speed (a
single row doubled: alone it would take a matrix-vector path twice as slow; see
`benchmarks/results/cpu/verify_cost.md`). But a BLAS product of n rows sums a row in an order that depends
on n and on the row's place (MKL and OpenBLAS block by the row count: rows 0-3 of 6 already differ from
the row alone, on AVX2 and AVX-512 alike), and a verify pass must give a token the logits a plain step
gives it. So each of up to `MAX_ROWS` rows is its own product of one shape, the row doubled, as a plain
step's is: the same call on the same values, whatever the pass. A pass of n rows reads the weights n
times (the compiled step, `numba_layers`, reads them once for all its tokens; this is the eager
layers'). Larger inputs (prefill chunks) and other devices use `F.linear` unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # above this (prefill chunks) F.linear's path is the efficient one


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] times weight [out, in]: each row as (W @ [row, row].T)[:, 0] for the few rows of a
    CPU step (see above), F.linear otherwise."""
    rows = x.reshape(-1, weight.shape[1])  # [n, in]
    if rows.shape[0] > MAX_ROWS or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    out = torch.stack([(weight @ row.repeat(2, 1).T)[:, 0] for row in rows])  # [n, out]
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
