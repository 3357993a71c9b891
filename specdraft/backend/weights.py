"""A decoder layer's weights as the compiled CPU steps read them (`numba_layers`, `inductor`): its
linears, each as (weight, bias, scales), q/k/v and gate/up joined into one buffer each; how each
holds its weight (`storage`) and so which code reads them (`linears_reader`); and whether a model is
large enough for compiling a step to pay."""

from __future__ import annotations

import torch

from specdraft.backend.native import BlockEmbedding, BlockLinear, Reader, Storage, reader
from specdraft.backend.weight_only_int8 import WeightOnlyInt8Linear
from specdraft.backend.linear import FewRowsLinear

MIN_WEIGHT_BYTES = 64 << 20  # smaller models keep the eager layers by default (`worth_compiling`)


def worth_compiling(model: torch.nn.Module) -> bool:
    """Whether compiling a CPU step is worth its seconds: the weights (at least `MIN_WEIGHT_BYTES`)
    outgrow the caches, so a step is bound by reading them. Smaller models (the test suite's tiny
    ones) keep the eager layers unless asked, but for blocks computing in the int8 arithmetic, which
    the compiled step runs for every pass (`numba_layers`)."""
    if any(isinstance(m, BlockLinear) and m.arithmetic == "int8" for m in model.modules()):
        return True
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values()) >= MIN_WEIGHT_BYTES


def model_device(model: torch.nn.Module) -> torch.device:
    """The device a model's token embedding is on (a float weight or GGUF blocks)."""
    embedding = model.get_input_embeddings()
    return embedding.blocks.device if isinstance(embedding, BlockEmbedding) else embedding.weight.device


def activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model's embedding gives its activations (GGUF blocks: float32)."""
    embedding = model.get_input_embeddings()
    return torch.float32 if isinstance(embedding, BlockEmbedding) else embedding.weight.dtype


def storage(module: torch.nn.Module | None) -> Storage:
    """How a linear layer holds its weight: GGUF blocks (`BlockLinear`), int8 rows
    (`WeightOnlyInt8Linear`), float32 rows (`nn.Linear`, `FewRowsLinear`), or otherwise (another dtype
    or layer, or None)."""
    if isinstance(module, BlockLinear):
        return Storage.BLOCKS
    if type(module) is WeightOnlyInt8Linear:
        return Storage.INT8
    if type(module) in (torch.nn.Linear, FewRowsLinear) and module.weight.dtype == torch.float32:
        return Storage.FLOAT32
    return Storage.OTHER


def linears_reader(model: torch.nn.Module, layers: list[torch.nn.Module]) -> Reader:
    """The code that reads the linears of `layers` and the output layer (`native.reader`)."""
    return reader({storage(m) for m in layer_linears(model, layers)}, model_device(model))


def linears_arithmetic(model: torch.nn.Module, layers: list[torch.nn.Module]) -> str:
    """The arithmetic the GGUF-block linears of `layers` and the output layer compute in
    (`native.ARITHMETICS`): "int8" where they all do, else "float32" (float32 rows, int8 draft
    copies and blocks alike); a mix of the two is refused (one step computes in one)."""
    chosen = {m.arithmetic for m in layer_linears(model, layers) if isinstance(m, BlockLinear)}
    if len(chosen) > 1:
        raise ValueError(f"the layers mix arithmetics: {sorted(chosen)}; one step computes in one")
    return "int8" if chosen == {"int8"} else "float32"


def read_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """What a step reads of a linear layer: its GGUF blocks, or its weight (and an int8 one's
    scales); nothing of other modules."""
    if isinstance(module, BlockLinear):
        return [module.blocks]
    if type(module) is WeightOnlyInt8Linear:
        return [module.weight, module.scales]
    return [module.weight] if isinstance(module, (torch.nn.Linear, FewRowsLinear)) else []


def float_linear(module: torch.nn.Module) -> bool:
    """A float linear layer: torch's, or `FewRowsLinear`."""
    return isinstance(module, (torch.nn.Linear, FewRowsLinear))


def plain_linear(module: torch.nn.Module) -> bool:
    """A float linear layer, or an int8 one (`WeightOnlyInt8Linear`)."""
    return type(module) in (torch.nn.Linear, FewRowsLinear, WeightOnlyInt8Linear)


def layer_linears(model: torch.nn.Module, layers: list[torch.nn.Module]) -> list:
    """The output layer and every projection of `layers` (None where a layer lacks one)."""
    linears = [model.lm_head] + [getattr(layer.self_attn, n, None) for layer in layers
                                 for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return linears + [getattr(layer.mlp, n, None) for layer in layers for n in ("gate_proj", "up_proj", "down_proj")]


def projections(layer: torch.nn.Module) -> tuple[list, list, list, list]:
    """A decoder layer's linears as a step reads them: q/k/v (joined), output, gate/up (joined), down."""
    a, mlp = layer.self_attn, layer.mlp
    return [a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]


def projection(module: torch.nn.Module) -> tuple:
    """(weight, bias or None, scales of int8 weights or None) of a linear layer."""
    return module.weight, module.bias, getattr(module, "scales", None)


def mlp_gate(mlp: torch.nn.Module) -> str | None:
    """A gated MLP's activation as its config names it (Gemma's `hidden_activation`, else `hidden_act`)."""
    config = getattr(mlp, "config", None)
    return (getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
            or getattr(mlp, "hidden_act", None))


def silu_mlp(mlp: torch.nn.Module) -> bool:
    return mlp_gate(mlp) in ("silu", "swish")


def adjacent_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """These row blocks [rows_i, cols] as one [sum of rows, cols] view where they lie one after
    another in one storage, else None."""
    first = tensors[0]
    if not all(t.is_contiguous() and t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
               and t.storage_offset() == first.storage_offset() + sum(u.numel() for u in tensors[:i])
               for i, t in enumerate(tensors)):
        return None
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                   (sum(t.shape[0] for t in tensors), first.shape[1]))


def joined_projection(modules: list[torch.nn.Module]) -> tuple:
    """One projection (weight [sum of outs, in], bias, scales) whose row blocks are these linears':
    the layer's q/k/v (gate/up) projections become one reduction over one buffer. The modules'
    weights are made views of it (same values, nothing copied twice); joined already, it is reused."""
    weights = [m.weight for m in modules]
    with torch.no_grad():
        joined = adjacent_view(weights)
        if joined is None:
            joined = torch.cat([w.detach() for w in weights])
            start = 0
            for m, w in zip(modules, weights):
                view = joined[start : start + w.shape[0]]
                # A parameter stays a parameter; a buffer (int8 weights) stays a buffer.
                m.weight = view if "weight" in m._buffers else torch.nn.Parameter(view, requires_grad=w.requires_grad)
                start += w.shape[0]
        biases = [m.bias for m in modules]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else weights[0].new_zeros(m.weight.shape[0]) for m, b in zip(modules, biases)])
        scales = [getattr(m, "scales", None) for m in modules]
        scales = None if scales[0] is None else torch.cat(scales)
    return joined, bias, scales

