"""A decoder family as data: what our forward (`forward.OwnForward`), its layers (eager, numba,
inductor, Triton) and the native loader (`native.gguf_file`) know of a model, read once from its
config (which transformers fills from a GGUF's metadata): head counts and size, which projections
carry a bias, the rotary base, the norms' epsilon, a tied or untied output layer, the order a GGUF
holds q and k rows in (`Family`).

The families our forward runs are the rows of `FAMILIES`: Llama-architecture decoders (pre-norm
RMS norms, rotary embedding, grouped-query attention, a SiLU-gated MLP) that differ only in what a
`Family` holds (Qwen3's per-head q/k norms, a sliding window at the layers that have one, Phi-3's
projections held fused, among it); each row says what its config does not (where it keeps its biases, how llama.cpp
writes its q and k). The row is chosen here, by the config's `model_type`, and nowhere else: the
layers, kernels and loader take a `Family` and never read a family's name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fused:
    """A projection a family's model holds fused: `module` (under a decoder layer, Phi-3's
    `self_attn.qkv_proj`) is its `parts` stacked by rows in order, each then a module of its own beside
    it (`models.fused.unfuse`; the loader splits a file's tensor alike, `native.gguf_file`): query,
    key and value heads' rows where `by_heads`, else equal parts."""

    module: str
    parts: tuple[str, ...]
    by_heads: bool = False


@dataclass(frozen=True)
class Family:
    """A model's description: `heads` query heads over `kv_heads` key/value heads of `head_dim` each;
    `qkv_bias`, `out_bias`, `mlp_bias`: whether the q/k/v, output and MLP projections add a bias;
    `tied_head`: the output layer is the token embedding; `rope_theta`: the rotary embedding's base
    (its cos/sin come from the model's own rotary module, which reads the same config); `norm_eps`:
    every RMS norm's epsilon; `gguf_interleaved_qk`: a GGUF holds each head's q and k rows with their
    rotary halves interleaved (llama.cpp's converter permutes them for Llama's rotary embedding, not
    for Qwen2's, whose layout is transformers' own); `qk_norm`: each head's q and k pass an RMS norm
    over the head (a weight of `head_dim` per layer for q and one for k, the norms' epsilon) after their
    projection, before the rotary embedding (Qwen3); `window`: the sliding window's tokens (a token
    sees itself and the `window - 1` before it) at the layers `sliding` marks (by a layer's index;
    None: full attention everywhere); `local_rope`: the sliding layers' rotary embedding has a base
    of its own (the model's rotary module gives each layer type's); `norm_offset`: every RMS norm
    scales by (offset + weight), computed in float32 (Gemma's 1; its GGUF files hold weight + 1);
    `sandwich_norms`: the attention's and the MLP's outputs are normed before each joins the stream
    (`post_attention_layernorm`, `post_feedforward_layernorm`; the MLP's input norm is then
    `pre_feedforward_layernorm`); `activation`: the MLP gate's, "silu" or "gelu_tanh"; `fused`: the
    projections its model holds fused (`Fused`), split on loading; `model_type`: the config's, for
    messages; `rotary_dim`: the dimensions of each head its rotary embedding turns, where that is part of
    the head (`rotated`)."""

    model_type: str
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    tied_head: bool
    rope_theta: float
    norm_eps: float
    gguf_interleaved_qk: bool
    qk_norm: bool = False
    window: int | None = None
    sliding: tuple[bool, ...] = ()
    local_rope: bool = False
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    activation: str = "silu"
    fused: tuple[Fused, ...] = ()
    rotary_dim: int | None = None

    @property
    def rotated(self) -> int:
        """The dimensions of each head the rotary embedding turns: its first `rotary_dim` (Phi-4-mini's
        partial rotary, its cos and sin that wide), else all of it."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def part_rows(self, fused: Fused, rows: int) -> tuple[int, ...]:
        """The rows of each of a fused projection's parts (of `rows` in all): q, k and v by the heads'
        counts and size (`Fused.by_heads`), other parts (gate and up) alike."""
        if fused.by_heads:
            return self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim
        assert rows % len(fused.parts) == 0, (fused, rows)
        return (rows // len(fused.parts),) * len(fused.parts)

    def slides(self, layer: int) -> bool:
        """Whether the layer of this index attends over the sliding window only."""
        return self.window is not None and self.sliding[layer]

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    @property
    def shape(self) -> tuple[int, int, int]:
        """(heads, kv_heads, head_dim)."""
        return self.heads, self.kv_heads, self.head_dim


@dataclass(frozen=True)
class FileFamily:
    """What specdraft's loader reads of a family's GGUF: the tensors it maps (`top`, and `layer` after
    `blk.N.`; any other would be left out, and the model decoded wrong without it), the metadata
    key transformers takes a head's size from (`head_size_key`; None: embedding_length / head_count),
    the file's `general.architecture` (None: the config's model_type), the modules some of a layer's
    tensors go to where they differ from Llama's (`modules`: Gemma's `ffn_norm` is its MLP's input
    norm), the metadata keys it implements that others' files must not set (`reads`), and those its
    files set that llama.cpp and transformers' GGUF loader both leave unread for the family
    (`ignores`: Phi-3's sliding window, which llama.cpp turns off), so that the file decodes as
    theirs without them; `partial_rotary`: whether a rotary embedding over part of each head
    (`rope.dimension_count` below the head size: Phi-4-mini's) is read, as the config's
    `partial_rotary_factor` (`models.gguf_cache.gguf_config`)."""

    top: frozenset[str]
    layer: frozenset[str]
    head_size_key: str | None
    architecture: str | None = None
    modules: tuple[tuple[str, str], ...] = ()
    reads: frozenset[str] = frozenset()
    ignores: frozenset[str] = frozenset()
    partial_rotary: bool = False


_WEIGHTS = frozenset(f"{part}.weight" for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"))
_TOP = frozenset({"token_embd.weight", "output_norm.weight", "output.weight"})
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.x: a factor per pair of a head's dimensions, each frequency divided by it
# Phi-3's LongRoPE (its 128k models, Phi-3.5): the factors of a context within the original one, and past it
LONG_ROPE = ("rope_factors_short.weight", "rope_factors_long.weight")

@dataclass(frozen=True)
class _Row:
    """What a family's config does not say: which projections add a bias (a config field's name that
    does, or a constant), whether its GGUF files interleave q and k rows (`Family.gguf_interleaved_qk`),
    what its GGUF files hold that the loader reads (`file`, which `models.gguf_check` holds a file to),
    whether its heads' q and k are normed (`Family.qk_norm`), its norms' offset and sandwich norms, its
    fused projections (`Family.fused`), and whether its model reads a config's `layer_types`
    (Mistral's does not: every layer slides where its config gives a window)."""

    qkv: str | bool
    out: str | bool
    mlp: str | bool
    gguf_interleaved_qk: bool
    file: FileFamily
    qk_norm: bool = False
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    layer_types: bool = True
    fused: tuple[Fused, ...] = ()

    def read(self, config, which: str) -> bool:
        where = getattr(self, which)
        return bool(getattr(config, where, False)) if isinstance(where, str) else where


# model_type (a GGUF's `general.architecture`, which transformers takes as it) -> what its config does
# not say: the families our forward runs, the one list of them. A Llama file's biases would be dropped
# (transformers' GGUF config never gives Llama biases), and so would Qwen2's output and MLP biases;
# llama.cpp reads rope_freqs for Llama alone.
FAMILIES = {
    # Llama 2/3.x, SmolLM2
    "llama": _Row(qkv="attention_bias", out="attention_bias", mlp="mlp_bias", gguf_interleaved_qk=True,
                  file=FileFamily(_TOP | {ROPE_FREQS}, _WEIGHTS, head_size_key="rope.dimension_count")),
    # Mistral (a sliding window where its config has one; its GGUF files are llama.cpp's `llama`)
    "mistral": _Row(qkv=False, out=False, mlp=False, gguf_interleaved_qk=True, layer_types=False,
                    file=FileFamily(_TOP, _WEIGHTS, head_size_key="rope.dimension_count")),
    # Qwen2, Qwen2.5 (-Coder)
    "qwen2": _Row(qkv=True, out=False, mlp=False, gguf_interleaved_qk=False,
                  file=FileFamily(_TOP, _WEIGHTS | {"attn_q.bias", "attn_k.bias", "attn_v.bias"}, head_size_key=None)),
    # Qwen3 (dense): q/k norms, no biases unless its config asks; a head's size its own (128), which
    # transformers' GGUF config does not read (`models.gguf_cache` sets it from attention.key_length)
    "qwen3": _Row(qkv="attention_bias", out="attention_bias", mlp=False, gguf_interleaved_qk=False, qk_norm=True,
                  file=FileFamily(_TOP, _WEIGHTS | {"attn_q_norm.weight", "attn_k_norm.weight"},
                                  head_size_key="attention.key_length")),
    # Gemma 3 (text): a scaled embedding (its module's), (1 + w) norms, q/k norms, norms after attention
    # and the MLP, a GELU-tanh gate, sliding layers with a rotary base of their own, a tied head
    "gemma3_text": _Row(qkv="attention_bias", out="attention_bias", mlp=False, gguf_interleaved_qk=False,
                        qk_norm=True, norm_offset=1.0, sandwich_norms=True,
                        file=FileFamily(_TOP, _WEIGHTS | {"attn_q_norm.weight", "attn_k_norm.weight",
                                                          "post_attention_norm.weight", "post_ffw_norm.weight"},
                                        head_size_key="attention.key_length", architecture="gemma3",
                                        modules=(("ffn_norm", "pre_feedforward_layernorm"),
                                                 ("post_attention_norm", "post_attention_layernorm"),
                                                 ("post_ffw_norm", "post_feedforward_layernorm")),
                                        reads=frozenset({"attention.sliding_window"}))),
    # Phi-3 (and Phi-4): q/k/v and gate/up fused (its files' attn_qkv and ffn_up too), no biases; its
    # files' sliding window is one llama.cpp turns off and transformers' GGUF config does not read; its
    # 128k models' LongRoPE factors and attention factor (`models.long_rope`); Phi-4-mini's partial rotary
    "phi3": _Row(qkv=False, out=False, mlp=False, gguf_interleaved_qk=False,
                 fused=(Fused("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj"), by_heads=True),
                        Fused("mlp.gate_up_proj", ("gate_proj", "up_proj"))),
                 file=FileFamily(_TOP | set(LONG_ROPE),
                                 frozenset(f"{part}.weight" for part in ("attn_norm", "attn_qkv", "attn_output",
                                                                         "ffn_norm", "ffn_up", "ffn_down")),
                                 head_size_key=None, modules=(("attn_qkv", "self_attn.qkv_proj"),
                                                              ("ffn_up", "mlp.gate_up_proj")),
                                 reads=frozenset({"rope.scaling.attn_factor"}),
                                 ignores=frozenset({"attention.sliding_window"}), partial_rotary=True)),
}
# general.architecture -> what the loader reads of its files
FILE_FAMILIES = {row.file.architecture or model_type: row.file for model_type, row in FAMILIES.items()}


def attention_shape(config) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) of any decoder's config (the stock forward's cache needs them too)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim


def projection_work(config) -> float | None:
    """The multiply-adds of a layer's projections a token (q, k, v, o and a gated MLP; None where the
    config does not say)."""
    heads, kv_heads, head_dim = attention_shape(config)
    hidden, inner = getattr(config, "hidden_size", None), getattr(config, "intermediate_size", None)
    if not hidden or not inner:
        return None
    return float(hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inner)


def attention_knee(config) -> float:
    """How many cache entries a token's attention reads before it costs as many multiply-adds as its
    layer's projections (inf where the config does not say): past it, attention is most of a prefill
    pass's work (SmolLM2-135M: 3072 entries)."""
    heads, _, head_dim = attention_shape(config)
    work = projection_work(config)
    return float("inf") if work is None else work / (2 * heads * head_dim)  # a key and a value a query head


ATTENTION_KINDS = ("full_attention", "sliding_attention")  # the layer types (a config's `layer_types`) we run


def _layer_types(config) -> list[str]:
    """Each layer's attention as the family's model reads it: the config's `layer_types` where its
    row reads them (Qwen2 and Qwen3 with use_sliding_window, Gemma 3), else every layer sliding where
    the config gives a window (Mistral), full where not."""
    given = getattr(config, "layer_types", None) if FAMILIES[config.model_type].layer_types else None
    window = getattr(config, "sliding_window", None)  # Qwen2, Qwen3: None unless use_sliding_window
    return list(given or [ATTENTION_KINDS[1] if window else ATTENTION_KINDS[0]] * config.num_hidden_layers)


def _sliding(config) -> tuple[int | None, tuple[bool, ...]]:
    """(the sliding window, whether each layer slides) of a config (`_layer_types`); (None, ()) where no
    layer slides."""
    sliding = tuple(kind == ATTENTION_KINDS[1] for kind in _layer_types(config))
    return (config.sliding_window, sliding) if any(sliding) else (None, ())


def family_problem(config) -> str | None:
    """Why our forward does not run a model of this config (None: it does): a family not in
    `FAMILIES`, layers of attention other than full or over a sliding window, or what else its
    model computes that ours does not (`_rope_problem`: rotary embedding over part of a head, or
    frequencies switched by length)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        return f"{model_type!r} is not a family our forward runs ({', '.join(FAMILIES)})"
    kinds = set(_layer_types(config))
    if not kinds <= set(ATTENTION_KINDS):
        return f"layers of attention other than full or sliding: {sorted(kinds - set(ATTENTION_KINDS))}"
    if ATTENTION_KINDS[1] in kinds and not getattr(config, "sliding_window", None):
        return "sliding layers without a window"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention (an embedding model)"
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, field, None):
            return f"{field} {getattr(config, field)}"
    scalar, (_, _, head_dim) = getattr(config, "query_pre_attn_scalar", None), attention_shape(config)
    if scalar is not None and scalar != head_dim:
        return f"attention scaled by query_pre_attn_scalar {scalar}, not the head size {head_dim}"
    if _activation(config) is None:
        return f"an MLP gate of {_gate(config)!r} (silu or gelu_pytorch_tanh)"
    return _rope_problem(config)


def _rope_problem(config) -> str | None:
    """What a config's rotary embedding asks that our attention does not do (None: nothing): rotating
    part of each head where that is no whole pairs of dimensions, or frequencies that change with the
    sequence's length (dynamic NTK). Others (Llama 3's, linear) are the rotary module's own frequencies,
    which every path takes as they are; LongRoPE's (Phi-3's 128k models) are fixed by the context served
    (`models.long_rope`); a partial one (Phi-4-mini's) turns the first `Family.rotated` dimensions."""
    rope = getattr(config, "rope_parameters", None) or {}
    part, (_, _, head_dim) = _partial_rotary(config), attention_shape(config)
    if part != 1.0 and (not 0 < head_dim * part < head_dim or head_dim * part % 2):
        return f"a rotary embedding over part of each head (partial_rotary_factor {part}) that is not whole pairs of its {head_dim} dimensions"
    for parameters in [rope, *(value for value in rope.values() if isinstance(value, dict))]:
        if parameters.get("rope_type") == "dynamic":
            return "rotary frequencies that change with the sequence's length (dynamic)"
    return None


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _gate(config) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _activation(config) -> str | None:
    """The MLP gate's activation as `Family.activation` names it, None where we have no kernel for it."""
    return _ACTIVATIONS.get(_gate(config))


def family_of(config) -> Family | None:
    """The description of a model of this config, or None where `family_problem` says why not."""
    if family_problem(config) is not None:
        return None
    row = FAMILIES[config.model_type]
    window, sliding = _sliding(config)
    rope = getattr(config, "rope_parameters", None) or {}
    local = "sliding_attention" in rope  # a base per layer type (Gemma 3): the full layers' is the model's
    theta = (rope.get("full_attention", rope) if local else rope).get("rope_theta", getattr(config, "rope_theta", 1e4))
    return Family(config.model_type, *attention_shape(config), qkv_bias=row.read(config, "qkv"),
                  out_bias=row.read(config, "out"), mlp_bias=row.read(config, "mlp"),
                  tied_head=bool(getattr(config, "tie_word_embeddings", False)), rope_theta=float(theta),
                  norm_eps=float(config.rms_norm_eps), gguf_interleaved_qk=row.gguf_interleaved_qk,
                  qk_norm=row.qk_norm, window=window, sliding=sliding, local_rope=local,
                  norm_offset=row.norm_offset, sandwich_norms=row.sandwich_norms, activation=_activation(config),
                  fused=row.fused, rotary_dim=_rotary_dim(config))


def _partial_rotary(config) -> float:
    """The part of each head a config's rotary embedding turns (its `partial_rotary_factor`, 1 where none)."""
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0))


def _rotary_dim(config) -> int | None:
    """The dimensions of each head the rotary embedding turns where it is part of the head (None: all)."""
    part, (_, _, head_dim) = _partial_rotary(config), attention_shape(config)
    return None if part == 1.0 else int(head_dim * part)
