"""Check a GGUF file before anything else reads it (before transformers converts it, before its
blocks are memory-mapped for the kernel): `check_gguf` reads only the header, the metadata and the
tensor infos, and raises `BadModelFileError` naming the file and its first problem, or returns the
file's `GgufLayout`. After it passes, every tensor's data lies whole inside the file, aligned, in a
block kind the loader reads, and the model is of a family specdraft decodes, with nothing in it that
would make specdraft's arithmetic differ from the model's: no tensor the family's loader does not
read (its `FileFamily` in `backend.family.FAMILIES`, the one list of families, by architecture in `FILE_FAMILIES`), no metadata asking
for what specdraft does not implement (`UNIMPLEMENTED`), heads of one size that the rotary embedding
covers whole (`_head_size`). Llama 3.x's `rope_freqs` is read (`models.loader.load` applies it). The layout
(`GgufLayout`, `TensorInfo`) is the kernel wing's value (`backend.native.layout`), handed down to it.

The format (GGUF v2 and v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64
key-value count; the key-values (a string key, a u32 value type, the value); the tensor infos (a
string name, u32 dimension count, u64 dimensions, u32 type, u64 offset from the data section); the
data section at the next multiple of `general.alignment` (default 32). A string is a u64 length
and its bytes; an array a u32 item type, a u64 count and the items.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from specdraft.backend.family import FILE_FAMILIES, LONG_ROPE, ROPE_FREQS, FileFamily
from specdraft.backend.native.layout import GgufLayout, TensorInfo
from specdraft.errors import BadModelFileError

VERSIONS = (2, 3)  # GGUF v1 counted in u32s; gguf's reader (and transformers) read v2 and v3
MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS

# The block kinds a model loads from: every GGUF is first dequantised by transformers, through
# gguf's `dequantize` (F32, F16 and each kind `gguf.quants` has a class for); the native reader's
# Q4_1/Q8_0 are among them.
READ_KINDS = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16}
                       | {t for t in GGMLQuantizationType if isinstance(getattr(quants, t.name, None), type)})

_SCALARS = {  # value type -> struct format of one item
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class Unimplemented:
    """A metadata key (after `{architecture}.`) that changes a model's arithmetic: the values that leave
    it as specdraft computes it (llama.cpp's default, or the feature off), and what any other asks for."""

    key: str
    neutral: tuple
    asks: str


UNIMPLEMENTED = (  # what llama.cpp reads for its llama arch, and what other families write, beyond our forward
    Unimplemented("rope.scaling.type", ("none", "linear"), "rotary scaling other than linear (YaRN, LongRoPE)"),
    Unimplemented("rope.scaling.factor", (0.0, 1.0), "rotary positions scaled by this factor"),
    Unimplemented("rope.scale_linear", (0.0, 1.0), "rotary positions scaled by this factor"),
    Unimplemented("rope.scaling.attn_factor", (1.0,), "the rotary embedding's cos and sin scaled"),
    Unimplemented("attention.sliding_window", (0,), "sliding-window attention"),
    Unimplemented("attn_logit_softcapping", (0.0,), "attention scores soft-capped"),
    Unimplemented("final_logit_softcapping", (0.0,), "logits soft-capped"),
    Unimplemented("expert_count", (0,), "a mixture of experts"),
    Unimplemented("expert_used_count", (0,), "a mixture of experts"),
    Unimplemented("expert_shared_count", (0,), "shared experts"),
    Unimplemented("logit_scale", (1.0,), "logits scaled"),
    Unimplemented("embedding_scale", (1.0,), "embeddings scaled"),
    Unimplemented("residual_scale", (1.0,), "residual branches scaled"),
    Unimplemented("attention.scale", (0.0,), "attention scores scaled other than by 1/sqrt(head size)"),
    Unimplemented("attention.clamp_kqv", (0.0,), "q, k and v clamped"),
    Unimplemented("attention.max_alibi_bias", (0.0,), "ALiBi position biases"),
    Unimplemented("attention.causal", (True,), "attention that is not causal"),
    Unimplemented("use_parallel_residual", (False,), "attention and MLP in parallel"),
    Unimplemented("attention.q_lora_rank", (0,), "low-rank (latent) attention"),
    Unimplemented("attention.kv_lora_rank", (0,), "low-rank (latent) attention"),
)


class _Cursor:
    """Reads a GGUF's little-endian values from `buf`, each checked to lie inside the file; running
    past the end is a truncation, named by the section being read (`section`)."""

    def __init__(self, buf, path: Path) -> None:
        self.buf, self.path, self.pos, self.section = buf, path, 0, "header"

    def need(self, n: int) -> None:
        """Raise the truncation where fewer than `n` bytes are left."""
        if self.pos + n > len(self.buf):
            raise _bad(self.path, f"the file ends inside its {self.section}, at byte {len(self.buf):,} "
                                  f"of the {self.pos + n:,} needed: truncated or corrupted")

    def take(self, n: int) -> int:
        """Step over `n` bytes; return where they start."""
        self.need(n)
        start, self.pos = self.pos, self.pos + n
        return start

    def value(self, fmt: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        n = self.value("<Q")
        start = self.take(n)
        return bytes(self.buf[start:start + n])

    def text(self, what: str) -> str:
        raw = self.string()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(self.path, f"{what} is not UTF-8 text ({raw[:40]!r}): corrupted") from None


def _bad(path: Path, problem: str) -> BadModelFileError:
    return BadModelFileError(f"bad model file {path}: {problem}", path=str(path), problem=problem)


def check_gguf(path: Path | str) -> GgufLayout:
    """Check that `path` is a GGUF specdraft can load (the module docstring lists what), reading only
    its header, metadata and tensor infos; raise `BadModelFileError` naming the first problem."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size < len(MAGIC):
                raise _bad(path, f"the file is {size} bytes, too short for a GGUF header: truncated")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _layout(_Cursor(buf, path))
    except OSError as exc:
        raise _bad(path, f"cannot be read: {exc.strerror or exc}") from None


def _layout(cur: _Cursor) -> GgufLayout:
    magic = bytes(cur.buf[cur.take(4):4])
    if magic != MAGIC:
        raise _bad(cur.path, f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    version = cur.value("<I")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        why = "a big-endian GGUF" if swapped in VERSIONS else f"GGUF version {version}"
        raise _bad(cur.path, f"{why} is not supported (little-endian GGUF versions {', '.join(map(str, VERSIONS))})")
    n_tensors, n_keys = cur.value("<Q"), cur.value("<Q")
    metadata = _metadata(cur, n_keys)
    architecture = _architecture(cur.path, metadata.get("general.architecture"))
    alignment = _alignment(cur.path, metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    tensors = _tensor_infos(cur, n_tensors)
    data_start = -(-cur.pos // alignment) * alignment
    _check_data(cur.path, tensors, data_start, alignment, len(cur.buf))
    _check_arithmetic(cur.path, architecture, metadata, tensors)
    return GgufLayout(version, architecture, alignment, data_start, len(cur.buf), tensors)


def _metadata(cur: _Cursor, count: int) -> dict[str, object]:
    """The key-values a check reads (every scalar, and the strings outside `tokenizer.*`); the rest
    (arrays, the tokenizer's strings) are skipped, each checked to lie inside the file."""
    cur.section = f"metadata ({count:,} key-values)"
    cur.need(count * 12)  # each at least a key length and a value type
    wanted = {}
    for i in range(count):
        cur.section = f"metadata (key-value {i + 1} of {count:,})"
        key = cur.text(f"metadata key {i + 1}")
        cur.section = f"metadata (key-value {i + 1} of {count:,}, {key!r})"
        kind = cur.value("<I")
        if kind == GGUFValueType.ARRAY:
            _skip_array(cur, key)
        elif kind == GGUFValueType.STRING and not key.startswith("tokenizer."):
            wanted[key] = cur.text(key)
        elif kind in _SCALARS:
            wanted[key] = cur.value(_SCALARS[GGUFValueType(kind)])
        else:
            _skip_item(cur, key, kind)
    return wanted


def _skip_item(cur: _Cursor, key: str, kind: int) -> None:
    if kind == GGUFValueType.STRING:
        cur.take(cur.value("<Q"))
    elif kind in _SCALARS:
        cur.take(struct.calcsize(_SCALARS[GGUFValueType(kind)]))
    else:
        raise _bad(cur.path, f"metadata key {key!r} has value type {kind}, not a GGUF value type: corrupted")


def _skip_array(cur: _Cursor, key: str) -> None:
    kind, count = cur.value("<I"), cur.value("<Q")
    if kind in _SCALARS:
        cur.take(count * struct.calcsize(_SCALARS[GGUFValueType(kind)]))
    elif kind == GGUFValueType.STRING:
        cur.need(count * 8)  # each at least its length
        cur.pos = _after_strings(cur, count)
    else:  # arrays of arrays: no model file has them, and gguf's own reader does not read them
        raise _bad(cur.path, f"metadata key {key!r} is an array of value type {kind}, which is not read")


def _after_strings(cur: _Cursor, count: int) -> int:
    """Where `count` strings from the cursor end (a tokenizer's 150,000 of them: one tight loop, not
    a call per string), each checked to start inside the file (`_Cursor.need`: a truncation)."""
    buf, pos, end, length = cur.buf, cur.pos, len(cur.buf) - 8, struct.Struct("<Q").unpack_from
    for _ in range(count):
        if pos > end:
            cur.pos = pos
            cur.need(8)  # raises: the file ends inside a string's length
        pos += 8 + length(buf, pos)[0]
    cur.pos = pos
    cur.need(0)  # raises where the last string runs past the end
    return pos


def _architecture(path: Path, architecture: object) -> str:
    if architecture is None:
        raise _bad(path, "no general.architecture in its metadata (the model family is unknown)")
    if architecture not in FILE_FAMILIES:
        raise _bad(path, f"general.architecture is {architecture!r}, not a family specdraft decodes "
                         f"({', '.join(FILE_FAMILIES)})")
    return str(architecture)


def _alignment(path: Path, alignment: object) -> int:
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise _bad(path, f"general.alignment is {alignment!r}, not a positive power of two: corrupted")
    return alignment


def _tensor_infos(cur: _Cursor, count: int) -> tuple[TensorInfo, ...]:
    cur.section = f"tensor infos ({count:,} tensors)"
    if count == 0:
        raise _bad(cur.path, "it holds no tensors")
    cur.need(count * 24)  # each at least a name length, a dimension count, a type and an offset
    tensors, names = [], set()
    for i in range(count):
        cur.section = f"tensor infos (tensor {i + 1} of {count:,})"
        name = cur.text(f"tensor name {i + 1}")
        cur.section = f"tensor infos (tensor {i + 1} of {count:,}, {name!r})"
        n_dims = cur.value("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _bad(cur.path, f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS}): corrupted")
        shape = tuple(cur.value("<Q") for _ in range(n_dims))
        kind, offset = cur.value("<I"), cur.value("<Q")
        if name in names:
            raise _bad(cur.path, f"tensor {name!r} appears twice: corrupted")
        names.add(name)
        tensors.append(_tensor(cur.path, name, shape, kind, offset))
    return tuple(tensors)


def _tensor(path: Path, name: str, shape: tuple[int, ...], kind: int, offset: int) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(kind)
    except ValueError:
        raise _bad(path, f"tensor {name!r} has type {kind}, not a GGML type: corrupted or newer than this gguf") from None
    if qtype not in READ_KINDS:
        raise _bad(path, f"tensor {name!r} is in block kind {qtype.name}, which neither specdraft's native reader "
                         "nor transformers' dequantisation reads")
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if shape[0] % block:
        raise _bad(path, f"tensor {name!r} has rows of {shape[0]} weights, not whole {qtype.name} blocks of {block}")
    count = 1
    for n in shape:
        count *= n
    return TensorInfo(name, qtype, shape, offset, count // block * block_bytes)


def _check_data(path: Path, tensors: tuple[TensorInfo, ...], data_start: int, alignment: int, size: int) -> None:
    for t in tensors:
        if t.offset % alignment:
            raise _bad(path, f"tensor {t.name!r} starts at data offset {t.offset:,}, not a multiple of the "
                             f"alignment {alignment}: corrupted")
        end = data_start + t.offset + t.nbytes
        if end > size:
            raise _bad(path, f"tensor {t.name!r} ({t.kind.name}, {t.nbytes:,} bytes) ends at byte {end:,}, past "
                             f"the end of the file ({size:,} bytes): truncated, or its offset is corrupted")


def _check_arithmetic(path: Path, architecture: str, metadata: dict[str, object],
                      tensors: tuple[TensorInfo, ...]) -> None:
    """Refuse a file that specdraft would decode otherwise than the model computes: a key of
    `UNIMPLEMENTED` at a value other than its neutral ones, heads of sizes the loader does not take
    (`_head_size`), a tensor the family's loader does not read (`FileFamily`), Llama 3's rotary factors
    in another shape than one float32 factor per pair of a head's dimensions."""
    family = FILE_FAMILIES[architecture]
    for row in UNIMPLEMENTED:
        if row.key in family.reads | family.ignores:  # implemented (Gemma 3's window), or unread (Phi-3's)
            continue
        key = f"{architecture}.{row.key}"
        value = metadata.get(key, row.neutral[0])
        if value not in row.neutral:
            raise _bad(path, f"{key} is {value!r}: {row.asks}, which specdraft does not implement")
    head = _head_size(path, architecture, metadata)
    for t in tensors:
        if not _read(t.name, FILE_FAMILIES[architecture]):
            raise _bad(path, f"tensor {t.name!r} is not one specdraft's {architecture} loader reads: the model "
                             "would be decoded without it, which specdraft does not do")
        pairs = None if head is None else metadata.get(f"{architecture}.rope.dimension_count", head) // 2
        if t.name in (ROPE_FREQS, *LONG_ROPE) and (t.kind != GGMLQuantizationType.F32 or len(t.shape) != 1
                                                   or pairs not in (None, t.shape[0])):
            raise _bad(path, f"tensor {t.name!r} is {t.kind.name} of shape {t.shape}, not float32 rotary factors, "
                             f"one per pair of a head's dimensions ({pairs})")
    _check_long_rope(path, architecture, metadata, {t.name for t in tensors})


def _check_long_rope(path: Path, architecture: str, metadata: dict[str, object], names: set[str]) -> None:
    """LongRoPE whole or not at all: both sets of factors, and the original context they switch at; an
    attention factor (cos and sin scaled) only beside them (`models.long_rope` reads them)."""
    held = [name for name in LONG_ROPE if name in names]
    if held and (len(held) < 2 or f"{architecture}.rope.scaling.original_context_length" not in metadata):
        raise _bad(path, f"it holds {', '.join(held)} without {', '.join(sorted(set(LONG_ROPE) - set(held))) or 'its original context'}"
                         " (LongRoPE needs both sets of factors and the original context length)")
    factor = metadata.get(f"{architecture}.rope.scaling.attn_factor", 1.0)
    if not held and factor != 1.0:
        raise _bad(path, f"{architecture}.rope.scaling.attn_factor is {factor!r}: the rotary embedding's cos and sin "
                         "scaled without LongRoPE's factors, which specdraft does not implement")


def _read(name: str, family: FileFamily) -> bool:
    """Whether the family's loader reads the tensor `name` (`blk.N.part` or a top-level one)."""
    block, _, rest = name.partition(".")
    layer, _, part = rest.partition(".")
    if block == "blk":
        return layer.isdigit() and part in family.layer
    return name in family.top


def _head_size(path: Path, architecture: str, metadata: dict[str, object]) -> int | None:
    """A head's size as llama.cpp reads it (`attention.key_length`, default embedding_length /
    head_count), refused where the rotary embedding covers part of it, value heads are of another
    size, or transformers loads the model with another (`FileFamily.head_size_key`); None where the
    metadata does not give the sizes (transformers refuses the file then)."""
    def key(name: str) -> str:
        return f"{architecture}.{name}"

    width, heads = metadata.get(key("embedding_length")), metadata.get(key("attention.head_count"))
    if not isinstance(width, int) or not isinstance(heads, int) or heads <= 0:
        return None
    per_head, per_head_from = width // heads, "embedding_length / head_count"

    def size(name: str | None, default: int) -> tuple[str, int]:
        """(where a size comes from, the size): the key `name` where the metadata has it, else the default."""
        if name is None or key(name) not in metadata:
            return per_head_from, default
        return key(name), metadata[key(name)]

    head_from, head = size("attention.key_length", per_head)
    loaded_from, loaded = size(FILE_FAMILIES[architecture].head_size_key, per_head)
    turned = size("rope.dimension_count", head)[1]
    partial = FILE_FAMILIES[architecture].partial_rotary and isinstance(turned, int) and 0 < turned < head and turned % 2 == 0
    sizes = (  # (what, its size, what another size than the key heads' asks for)
        (key("rope.dimension_count"), head if partial else turned, "rotary embedding on part of each head (partial rotary)"),
        (key("attention.value_length"), size("attention.value_length", per_head)[1],
         "value heads of another size than key heads"),
        (f"the head size transformers loads it with ({loaded_from})", loaded,
         "heads of a size its config does not give"),
    )
    for what, value, asks in sizes:
        if value != head:
            raise _bad(path, f"{what} is {value!r}, not the key head size {head!r} ({head_from}): {asks}, "
                             "which specdraft does not implement")
    return head
