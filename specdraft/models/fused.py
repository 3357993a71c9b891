"""A family's fused projections (`Family.fused`: Phi-3's q/k/v and gate/up), split on loading into the
modules every path reads (`unfuse`), each part a view of its rows of the fused weight; the fused module
left as a `Joined` of its parts, so that the stock forward (transformers' own, which the benchmark's
peers run) still calls it. Joined gives the fused module's outputs bitwise where the matrix product
sums each output on its own, whatever the rows beside it: torch's CPU products at Phi-3-mini's shapes
(3072 wide, 9216 and 16384 rows, 1-300 tokens) do (`tests/backend/test_phi3.py`)."""

from __future__ import annotations

import torch

from specdraft.backend.family import Family


class Joined(torch.nn.Module):
    """A fused projection after `unfuse`: its parts' outputs (its parent's modules of those names, as they
    are then, Linears or blocks), joined as the fused module gave them, for the stock forward, which
    still calls it. It holds no weights: the parts' are the only ones."""

    def __init__(self, parent: torch.nn.Module, parts: tuple[str, ...]) -> None:
        super().__init__()
        object.__setattr__(self, "_parent", parent)  # not a child module: the parts are the parent's
        self.parts = parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([getattr(self._parent, part)(x) for part in self.parts], dim=-1)


def unfuse(model: torch.nn.Module, family: Family) -> int:
    """Split each of the family's fused projections in every decoder layer (`Family.fused`: Phi-3's
    qkv_proj and gate_up_proj) into its parts, each a Linear over its rows of the fused weight (and
    bias): views, no copy, on whatever device the weight is (the meta device for a skeleton). The fused
    module becomes a `Joined` of them, so that no weight is held twice. Returns how many were split."""
    split = 0
    for layer in model.model.layers:
        for fused in family.fused:
            parent_name, _, child = fused.module.rpartition(".")
            parent = layer.get_submodule(parent_name)
            whole = getattr(parent, child)
            if isinstance(whole, Joined):  # split already
                continue
            start = 0
            for part, rows in zip(fused.parts, family.part_rows(fused, whole.out_features)):
                linear = torch.nn.Linear(whole.in_features, rows, bias=whole.bias is not None, device="meta")
                linear.weight = torch.nn.Parameter(whole.weight.data[start : start + rows], requires_grad=False)
                if whole.bias is not None:
                    linear.bias = torch.nn.Parameter(whole.bias.data[start : start + rows], requires_grad=False)
                setattr(parent, part, linear)
                start += rows
            assert start == whole.out_features, (fused, start, whole.out_features)
            setattr(parent, child, Joined(parent, fused.parts))
            split += 1
    return split
