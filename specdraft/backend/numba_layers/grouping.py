"""A model's linears grouped as a step reads them (`step_weights`: q/k/v joined, output, gate/up
joined, down; per layer, then the output layer), each group as `project` takes it, and the
compiled kernel where it reads them (`native_kernel`). A q/k/v group is a pair of parts (`_parts`),
so that blocks of two kinds (q and k of one, v of another, as GGUF's mixed files hold them) are
read as blocks, each part in its kind, not expanded to float32."""

from __future__ import annotations

import numpy as np
import torch

from specdraft.backend.native import F32, BlockLinear, Kernel, Reader, kernel
from specdraft.backend.weights import adjacent_view, joined_projection, linears_reader, projections


def host_array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as the NumPy array numba reads (a view where it is contiguous)."""
    return t.detach().contiguous().numpy()


def _weights(linear: tuple, native: bool) -> tuple:
    """(weight, bias or None, scales or None), as `weights.projection` gives it -> `project`'s
    (weight (a view), float32 scales (none: [0]), bias (none: zeros), kind). `native`: for the
    compiled kernel, the weight as its bytes [out, row bytes] (kind F32), else as it is (kind -1)."""
    weight, bias, scales = linear
    w = host_array(weight)
    return (w.view(np.uint8) if native else w, np.zeros(0, np.float32) if scales is None else host_array(scales.float()),
            np.zeros(weight.shape[0], np.float32) if bias is None else host_array(bias.float()), F32 if native else -1)


def _joined_bias(group: list[torch.nn.Module]) -> torch.Tensor | None:
    """The group's biases as one [sum of outs] (zeros for a linear without one), or None where none has one."""
    if all(m.bias is None for m in group):
        return None
    return torch.cat([m.bias.detach().float() if m.bias is not None else torch.zeros(m.out_features) for m in group])


def _group_weights(group: list[torch.nn.Module], native: bool) -> tuple:
    """`project`'s weights of a group of linears read as one projection (q/k/v, gate/up, or one), their
    biases joined (Qwen2's q/k/v)."""
    assert native or not any(isinstance(m, BlockLinear) for m in group), "numba's loops read no GGUF blocks"
    if all(isinstance(m, BlockLinear) for m in group) and len({m.kind for m in group}) == 1:
        tensors = [m.blocks for m in group]
        joined = adjacent_view(tensors)
        joined = torch.cat(tensors) if joined is None else joined
        bias = _joined_bias(group)
        bias = np.zeros(joined.shape[0], np.float32) if bias is None else host_array(bias)
        return joined.numpy(), np.zeros(0, np.float32), bias, group[0].kind
    if any(isinstance(m, BlockLinear) for m in group):  # blocks of several kinds, or blocks and rows: read as float32
        weight = torch.cat([m.dense() if isinstance(m, BlockLinear) else m.weight.detach() for m in group])
        return _weights((weight, _joined_bias(group), None), native)
    return _weights(joined_projection(group), native)



def _parts(group: list[torch.nn.Module], native: bool) -> tuple[tuple, tuple]:
    """A group as two parts, each `project`'s weights, whose outputs lie side by side: where the
    compiled kernel reads blocks and the group's kinds change once (q and k of one kind, v of
    another), the linears before the change and those after, each read as blocks of its kind;
    otherwise the whole group and an empty part (no rows)."""
    kinds = [m.kind if isinstance(m, BlockLinear) else None for m in group]
    split = next((i for i in range(1, len(group)) if kinds[i] != kinds[i - 1]), len(group))
    if native and None not in kinds and split < len(group) and len(set(kinds[split:])) == 1:
        return _group_weights(group[:split], native), _group_weights(group[split:], native)
    whole = _group_weights(group, native)
    w, scales, b, kind = whole
    return whole, (w[:0], scales[:0], b[:0], kind)


def step_weights(model: torch.nn.Module, layers: list[torch.nn.Module], native: bool = False) -> list[tuple]:
    """`project`'s weights of every projection of `layers` and of the output layer, in the order a
    step reads them (q/k/v joined, as a pair of parts (`_parts`); output; gate/up joined; down; per
    layer). `native`: as the compiled kernel reads them (bytes of float32 rows or GGUF blocks), else
    as numba's loops do."""
    out = []
    for layer in layers:
        qkv, *rest = projections(layer)
        out += [_parts(qkv, native)] + [_group_weights(g, native) for g in rest]
    return out + [_group_weights([model.lm_head], native)]


def read_parts(weights: list[tuple]) -> list[tuple]:
    """`step_weights`' projections, each q/k/v pair as its parts (those with rows): every projection
    call a step makes, in its order."""
    flat = []
    for entry in weights:
        flat += [p for p in entry if p[2].shape[0]] if isinstance(entry[0], tuple) else [entry]
    return flat


def native_kernel(model: torch.nn.Module, layers: list[torch.nn.Module]) -> Kernel | None:
    """The compiled kernel where it reads these layers' weights (float32 rows or GGUF blocks), or None
    where numba's loops do (int8 weights, or no kernel on this machine): `native.reader` decides."""
    return kernel() if linears_reader(model, layers) is Reader.KERNEL else None
