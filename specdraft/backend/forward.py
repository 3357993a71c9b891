"""Our own forward pass (`OwnForward`), for every family `family.FAMILIES` describes as data (Llama
2/3.x, SmolLM2, Qwen2/2.5, Qwen3), over the transformers model's own modules and weights: embedding, rotary
embedding, norms, projections and MLPs are called as they are; the layer loop, the KV writes and
attention are ours.

Why not the stock forward: it takes any subset of the decoder layers (draft models that skip layers),
runs its activations in a chosen dtype (other than the weights' for int8 draft copies), takes a boolean mask
built on the device, pays less Python per layer, and computes only a batch's real tokens: given
`real`, the flat indices of the real tokens in the padded [batch, T] input, every per-token part
(embedding, norms, projections, MLPs, output layer) runs on those alone and only attention sees
the padded layout. A verify step whose rows draft different lengths then costs its tokens, not
batch x the longest draft. Its logits equal the stock model's (`tests/backend/test_backend.py`,
`tests/backend/test_qwen2.py`). What it knows of a model is its `Family` (head counts and size, biases, the
norms' epsilon, read once from the config), which it hands to the layers; other architectures run
the stock forward (`RowModel` decides).

How it runs a pass's layers and head (`layers.py`): on CPU (`compiled`), passes of a few tokens
run compiled where they apply: numba's kernels for float32 activations (`numba_layers.NumbaLayers`:
float32 layers and int8 draft copies), inductor's parts for other dtypes
(`inductor.InductorLayers`); longer passes, and every pass otherwise, run the model's own modules
(`layers.EagerLayers`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdraft.backend.family import Family, family_of
from specdraft.backend.inductor import InductorLayers
from specdraft.backend.layers import EagerLayers, Pass
from specdraft.backend.numba_layers import NumbaLayers
from specdraft.backend.triton_layers import TritonLayers, unavailable
from specdraft.backend.weights import activation_dtype, model_device

KERNELS = ("auto", "triton", "torch")


def supports(model: torch.nn.Module) -> bool:
    """Whether `model` is a decoder this forward reproduces exactly: a family of `family.FAMILIES`
    whose attention is full or over a sliding window, the standard module layout, and biases, q/k
    norms and sandwich norms where its description says."""
    family = family_of(model.config)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if family is None or layers is None or not len(layers) or not all(hasattr(inner, n) for n in ("rotary_emb", "norm")):
        return False
    layer = layers[0]
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    parts = {n: getattr(attention, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    parts.update({n: getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")})
    if any(m is None for m in parts.values()) or not all(
            hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
        return False
    if all(hasattr(attention, n) for n in ("q_norm", "k_norm")) != family.qk_norm:
        return False
    sandwich = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    if all(hasattr(layer, n) for n in sandwich) != family.sandwich_norms:
        return False
    biased = {"q_proj": family.qkv_bias, "k_proj": family.qkv_bias, "v_proj": family.qkv_bias,
              "o_proj": family.out_bias, "gate_proj": family.mlp_bias, "up_proj": family.mlp_bias,
              "down_proj": family.mlp_bias}
    return all((getattr(m, "bias", None) is not None) == biased[n] for n, m in parts.items())


class OwnForward:
    """model: a causal LM `supports` takes; layers: indices of the decoder layers to run (default all);
    dtype: the activations' dtype (default the model's); compiled: on CPU, run passes of a few tokens
    compiled where that applies; kernels: "triton" runs every pass on the batch-invariant Triton
    kernels (`triton_layers`; an error where they cannot run), "torch" on the model's modules (and
    the compiled CPU layers), "auto" the Triton kernels on CUDA where they apply."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 compiled: bool = False, kernels: str = "auto") -> None:
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}; got {kernels!r}")
        assert supports(model), type(model).__name__
        self.family: Family = family_of(model.config)
        self.model = model
        indices = range(len(model.model.layers)) if layers is None else layers
        self.layers = [model.model.layers[i] for i in indices]
        self.dtype = dtype or activation_dtype(model)
        self.eager = EagerLayers(model, self.layers, self.dtype, self.family)
        self.invariant: TritonLayers | None = None
        wanted = kernels == "triton" or (kernels == "auto" and model_device(model).type == "cuda")
        why = unavailable(model, self.layers, self.dtype, self.family) if wanted else None
        if kernels == "triton" and why is not None:
            raise ValueError(f"kernels='triton' cannot run this model: {why}")
        if wanted and why is None:
            self.invariant = TritonLayers(model, self.layers, self.dtype, self.family)
        self.compiled: NumbaLayers | InductorLayers | None = None
        compiled = compiled and self.invariant is None  # the Triton kernels run every pass
        if compiled and NumbaLayers.applies(model, self.layers, self.dtype):
            self.compiled = NumbaLayers(model, self.layers, self.family)
        elif compiled and InductorLayers.applies(model, self.layers, self.dtype):
            self.compiled = InductorLayers(model, self.layers, self.dtype, self.family)

    @property
    def reads_lengths(self) -> bool:
        """Whether attention reads each token's position on the device and ignores the pass's mask
        and KV length (the Triton kernels): a captured pass then serves every KV length."""
        return self.invariant is not None

    @property
    def reads_pages(self) -> bool:
        """Whether the compiled CPU step's layers run here: their attention reads a paged cache in place
        (`paged.PagedKVCache`); other passes read it through `update`, gathered."""
        return isinstance(self.compiled, NumbaLayers)

    @property
    def compiled_tokens(self) -> int:
        """The longest pass the compiled layers run (0: none are; longer passes run the eager layers)."""
        return 0 if self.compiled is None else self.compiled.max_tokens

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple:
        """(cos, sin) [batch, T, head_dim] of the model's rotary module, in the activations' dtype (the
        full layers' where each layer type has its own), and the sliding layers' own (cos, sin) or None."""
        rotary = self.model.model.rotary_emb
        if not self.family.local_rope:
            return *(t.to(self.dtype) for t in rotary(x, positions)), None
        local = tuple(t.to(self.dtype) for t in rotary(x, positions, "sliding_attention"))
        return *(t.to(self.dtype) for t in rotary(x, positions, "full_attention")), local

    def _window_mask(self, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """`mask` [batch, 1, T, kv] where an entry also lies in the query's sliding window (its
        position minus the entry's under the window: the query itself and the `window - 1` before
        it); None where no layer slides."""
        window = self.family.window
        if window is None or mask is None:
            return None
        entries = torch.arange(mask.shape[-1], device=mask.device)
        return mask & (positions[:, None, :, None] - entries < window)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache,
                 logits_at: torch.Tensor | None = None, real: torch.Tensor | None = None,
                 ends: torch.Tensor | None = None) -> torch.Tensor:
        """positions: [batch, T]; input_ids: [batch, T], or, given `real` (the flat indices into
        [batch, T] of the tokens a packed pass computes), those tokens alone [N]; mask: [batch, 1, T,
        kv] bool, True where a query may look (None where the forward `reads_lengths`: attention then
        sees each token's positions up to its own); cache: a `KVCache` prepared for this pass (its
        layer i is the i-th layer run here); logits_at: [batch] the one position per row to return
        logits for (not with `real`); ends: [rows] the indices into [N] to return logits for (with
        `real` only). Positions outside `real` are padding: their keys and values are written zero,
        or not at all, past their row's tokens (never committed, never seen).
        Returns logits (float32): [batch, T, vocab], [batch, 1, vocab] at `logits_at`, [N, vocab]
        given `real`, [rows, vocab] at `ends`."""
        batch, steps = positions.shape
        assert real is None or logits_at is None, "a packed pass returns its tokens' logits, or at `ends`"
        assert ends is None or real is not None, "`ends` index a packed pass's tokens"
        ids = input_ids.reshape(-1)  # [N]
        x = self.model.model.embed_tokens(ids).to(self.dtype)  # [N, hidden]
        cos, sin, local = self._rotary(x, positions)  # [batch, T, head_dim]
        if self.invariant is not None:
            layers = self.invariant
        elif self.compiled is not None and self.compiled.takes(len(ids), steps):
            layers = self.compiled
        else:
            layers = self.eager
        windowed = self._window_mask(positions, mask)
        x = layers.stack(Pass(x, cos, sin, positions, mask, cache, real, batch, steps, windowed, local))
        if logits_at is not None:
            x = x.view(batch, steps, -1).gather(1, logits_at[:, None, None].expand(batch, 1, x.shape[-1])).view(batch, -1)
            return layers.head(x).view(batch, 1, -1)
        if ends is not None:
            return layers.head(x[ends])  # [rows, vocab]
        logits = layers.head(x)  # [N, vocab]
        return logits if real is not None else logits.view(batch, steps, -1)
