"""A Llama-shaped GGUF of random weights with its projections in one block kind, for timing a kind beside
llama.cpp on the same file (`benchmarks.cpu.int8_speed --model FILE --llama-bench PATH`).

One layer's projections are random normals quantised by gguf (`quantize`: `gguf.quants.quantize`; for
the kinds gguf does not quantise, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K and Q5_K, a plain quantiser of our own),
written for
every layer: a step reads as many bytes of them as of distinct layers, and quantising once keeps making
a 1B-class file to seconds. The embedding and output layer are Q8_0 (distinct tensors), the norms float32
ones, the config is metadata, and the tokenizer is byte-level (`byte_tokenizer`: a character per id, one
merge), which both specdraft and llama.cpp load. The vocabulary is 256 ids, so the projections, in
the kind timed, are what a step reads.

    python -m benchmarks.cpu.kind_files --kind Q4_0 --out /tmp/q4_0.gguf [--shape 1b]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

EOS = "<|endoftext|>"
BYTE_VOCAB = 258  # `byte_tokenizer`'s ids at most: 256 characters, a merge and the end of text
VOCAB = 256  # the files' vocabulary: a multiple of 8 rows, as the int8 arithmetic's tiles take
# Llama 3.2 1B's layers (its 128k vocabulary aside), and a small one for tests.
SHAPES = {"1b": {"hidden": 2048, "layers": 16, "intermediate": 8192, "heads": 32, "kv_heads": 8},
          "small": {"hidden": 256, "layers": 2, "intermediate": 512, "heads": 4, "kv_heads": 2}}


def byte_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """A byte-level BPE tokenizer of `vocab_size` <= BYTE_VOCAB ids: one character per id (GPT-2's byte
    characters), one merge (the first two characters), and the end of text last (also the beginning)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert vocab_size <= BYTE_VOCAB, vocab_size
    characters = list(bytes_to_unicode().values())[: vocab_size - 2]
    tokens = [*characters, characters[0] + characters[1], EOS]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (vocab_size - 1) + [gguf.TokenType.CONTROL])
    writer.add_token_merges([f"{characters[0]} {characters[1]}"])
    writer.add_eos_token_id(vocab_size - 1)
    writer.add_bos_token_id(vocab_size - 1)


def quantize(values: np.ndarray, type_name: str) -> np.ndarray:
    """float32 [rows, width] as blocks [rows, row bytes] of the GGUF type named: gguf's quantisation, or
    where gguf has none ours (`_iq4_nl`, `_k_blocks`: valid blocks near the values, not llama.cpp's
    search for the best scales)."""
    if type_name == "IQ4_NL":
        return _iq4_nl(values)
    if type_name == "IQ4_XS":
        return _iq4_xs(values)
    if type_name in ("Q4_K", "Q5_K"):
        return _k_blocks(values, int(type_name[1]))
    if type_name == "Q3_K":
        return _q3_k(values)
    if type_name == "Q2_K":
        return _q2_k(values)
    return gguf.quants.quantize(values, getattr(gguf.GGMLQuantizationType, type_name))


def _grid_points(blocks: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Each weight of blocks [..., 32] as the nearest of d [..., 1] times IQ4_NL's 16 grid values, packed
    as IQ4_NL packs them (byte j: element j's index in its low nibble, j + 16's in its high one)."""
    from specdraft.backend.native.formats import IQ4_NL_VALUES

    scaled = blocks / np.where(d == 0, 1, d).astype(np.float32)
    q = np.abs(scaled[..., None] - np.asarray(IQ4_NL_VALUES, np.float32)).argmin(-1).astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def _block_extremes(values: np.ndarray, weights: int) -> tuple[np.ndarray, np.ndarray]:
    """values [rows, width] as blocks [rows, blocks, weights], and each block's -(its weight of largest
    magnitude) / 127 [rows, blocks, 1]: a scale that puts that weight on the grid's -127."""
    blocks = values.reshape(values.shape[0], -1, weights)
    return blocks, np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1) / -127


def _iq4_nl(values: np.ndarray) -> np.ndarray:
    """IQ4_NL: per block of 32, d its `_block_extremes` scale, each weight its nearest grid point."""
    blocks, extreme = _block_extremes(values, 32)
    d = extreme.astype(np.float16)
    return np.concatenate([d.view(np.uint8), _grid_points(blocks, d)], axis=-1).reshape(values.shape[0], -1)


def _iq4_xs(values: np.ndarray) -> np.ndarray:
    """IQ4_XS: per super-block of 256, d = the largest of its sub-blocks' `_block_extremes` scales in
    magnitude / 32; each sub-block's scale as d times its 6-bit integer less 32, nearest; each weight its
    nearest grid point at that scale (formats.py's layout: scales_h, scales_l, then 8 x 16 bytes)."""
    rows = values.shape[0]
    blocks, extreme = _block_extremes(values, 32)  # [rows, sub-blocks, 32], [rows, sub-blocks, 1]
    wanted = extreme.reshape(rows, -1, 8)  # [rows, super-blocks, 8]
    d = (np.abs(wanted).max(-1) / 32).astype(np.float16)  # [rows, super-blocks]
    unit = np.where(d == 0, 1, d).astype(np.float32)[..., None]
    ls = np.clip(np.round(wanted / unit) + 32, 0, 63).astype(np.uint16)  # [rows, super-blocks, 8]
    step = (d.astype(np.float32)[..., None] * (ls.astype(np.float32) - 32)).reshape(rows, -1, 1)
    qs = _grid_points(blocks, step).reshape(*ls.shape[:2], 128)
    high = (((ls >> 4) & 3) << (2 * np.arange(8, dtype=np.uint16))).sum(-1, dtype=np.uint16)
    low = (ls[..., 0::2] & 15) | (ls[..., 1::2] & 15) << 4
    parts = [d[..., None].view(np.uint8), high[..., None].view(np.uint8), low.astype(np.uint8), qs]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


def _mins_and_steps(values: np.ndarray, groups: int, top: int, steps: int):
    """The kinds of scales and mins: per group of weights, its min (at most 0) and a scale spanning it to
    its max in `top` steps; per super-block of 256 (`groups` groups), d and dmin the largest of them /
    `steps`, each group's as an integer of those; each weight the nearest step, clipped. Returns (d, dmin
    [rows, super-blocks] float16, sc, m [.., groups] and q [.., groups, weights] uint8)."""
    w = values.reshape(values.shape[0], -1, groups, 256 // groups)
    low = np.minimum(w.min(-1), 0)
    scale, least = (w.max(-1) - low) / top, -low  # [rows, super-blocks, groups]
    d, dmin = (scale.max(-1) / steps).astype(np.float16), (least.max(-1) / steps).astype(np.float16)
    sc = np.clip(np.round(scale / np.where(d == 0, 1, d).astype(np.float32)[..., None]), 0, steps).astype(np.uint8)
    m = np.clip(np.round(least / np.where(dmin == 0, 1, dmin).astype(np.float32)[..., None]), 0, steps).astype(np.uint8)
    step = d.astype(np.float32)[..., None] * sc
    q = np.round((w + (dmin.astype(np.float32)[..., None] * m)[..., None]) / np.where(step == 0, 1, step)[..., None])
    return d, dmin, sc, m, np.clip(q, 0, top).astype(np.uint8)


def _pairs_of_bits(q: np.ndarray) -> np.ndarray:
    """2-bit integers [.., 256] of each super-block as 64 bytes (Q2_K's, Q3_K's low bits): element
    128h + 32j + l in byte 32h + l's bits 2j, 2j + 1."""
    q = q.reshape(*q.shape[:-1], 2, 4, 32)
    return ((q & 3) << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(-2, dtype=np.uint8).reshape(*q.shape[:-3], 64)


def _k_blocks(values: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (bits 4) or Q5_K (5): per sub-block of 32, its min (at most 0) and a scale spanning it to its
    max in 2^bits - 1 steps; per super-block of 256, d and dmin the largest of them / 63, each sub-block's
    as 6 bits of those; each weight the nearest step, clipped (formats.py's layouts: 12 bytes of 6-bit
    scales and mins, Q5_K's 32 bytes of 5th bits, 128 of nibbles)."""
    d, dmin, sc, m, q = _mins_and_steps(values, 8, (1 << bits) - 1, 63)
    scales = np.concatenate([sc[..., :4] | (sc[..., 4:] >> 4) << 6, m[..., :4] | (m[..., 4:] >> 4) << 6,
                             (sc[..., 4:] & 15) | (m[..., 4:] & 15) << 4], axis=-1)
    parts = [d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), scales]
    if bits == 5:  # qh byte e: bit s the 5th bit of sub-block s's element e
        parts.append(((q >> 4) << np.arange(8, dtype=np.uint8)[:, None]).sum(-2, dtype=np.uint8))
    parts.append(((q[..., 0::2, :] & 15) | (q[..., 1::2, :] & 15) << 4).reshape(*q.shape[:2], 128))
    return np.concatenate(parts, axis=-1).reshape(values.shape[0], -1)


def _q2_k(values: np.ndarray) -> np.ndarray:
    """Q2_K: per 16 weights, its min (at most 0) and a scale spanning it to its max in 3 steps; per
    super-block of 256, d and dmin the largest of them / 15, each 16's as 4 bits of those; each weight
    the nearest step, clipped (formats.py's layout: a byte of scale and min a 16, qs, d, dmin)."""
    d, dmin, sc, m, q = _mins_and_steps(values, 16, 3, 15)
    parts = [sc | m << 4, _pairs_of_bits(q.reshape(*q.shape[:2], 256)), d[..., None].view(np.uint8),
             dmin[..., None].view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(values.shape[0], -1)


def _q3_k(values: np.ndarray) -> np.ndarray:
    """Q3_K: per 16 weights, a scale that puts the weight of largest magnitude on -4 (`_block_extremes`);
    per super-block of 256, d the largest of them in magnitude / 32, each 16's as d times its 6-bit integer
    less 32, nearest; each weight the nearest of -4 .. 3 steps of it (formats.py's layout: hmask, qs, the
    12 bytes of scales, d)."""
    rows = values.shape[0]
    blocks, extreme = _block_extremes(values, 16)  # [rows, 16s, 16], [rows, 16s, 1]: d = -extreme / 127
    wanted = (extreme * 127 / 4).reshape(rows, -1, 16)  # [rows, super-blocks, 16]: -(largest) / 4
    d = (np.abs(wanted).max(-1) / 32).astype(np.float16)
    unit = np.where(d == 0, 1, d).astype(np.float32)[..., None]
    ls = np.clip(np.round(wanted / unit) + 32, 0, 63).astype(np.uint8)  # [rows, super-blocks, 16]
    step = (d.astype(np.float32)[..., None] * (ls.astype(np.float32) - 32)).reshape(rows, -1, 1)
    q = np.clip(np.round(blocks / np.where(step == 0, 1, step)) + 4, 0, 7).astype(np.uint8)
    q = q.reshape(*ls.shape[:2], 256)  # [rows, super-blocks, element]
    hmask = (((q >> 2) & 1).reshape(*ls.shape[:2], 8, 32) << np.arange(8, dtype=np.uint8)[:, None]).sum(-2, dtype=np.uint8)
    shifts = 2 * np.arange(4, dtype=np.uint8)[:, None]
    high = (((ls.reshape(*ls.shape[:2], 4, 4) >> 4) & 3) << shifts).sum(-2, dtype=np.uint8)  # byte 8 + c
    scales = np.concatenate([(ls[..., :8] & 15) | (ls[..., 8:] & 15) << 4, high], axis=-1)
    parts = [hmask, _pairs_of_bits(q), scales, d[..., None].view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


def write_kind_file(path: Path, kind: str, shape: dict, seed: int = 0) -> Path:
    """A random Llama of `shape` (`SHAPES`'s keys) with its projections in `kind` (a GGUF type name)."""
    rng = np.random.default_rng(seed)
    hidden, inter, heads, kv_heads = shape["hidden"], shape["intermediate"], shape["heads"], shape["kv_heads"]
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_block_count(shape["layers"])
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    byte_tokenizer(writer, VOCAB)

    def quantized(rows: int, width: int, type_name: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        return quantize((rng.standard_normal((rows, width)) * 0.02).astype(np.float32), type_name), qtype

    parts = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden), "attn_v": (kv_heads * head_dim, hidden),
             "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
             "ffn_down": (hidden, inter)}
    layer = {part: quantized(rows, width, kind) for part, (rows, width) in parts.items()}
    for name in ("token_embd", "output"):
        data, qtype = quantized(VOCAB, hidden, "Q8_0")
        writer.add_tensor(f"{name}.weight", data, raw_shape=data.shape, raw_dtype=qtype)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(shape["layers"]):
        for part, (data, qtype) in layer.items():
            writer.add_tensor(f"blk.{i}.{part}.weight", data, raw_shape=data.shape, raw_dtype=qtype)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", required=True, help="a GGUF block type: Q4_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, IQ4_NL, IQ4_XS ...")
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(write_kind_file(args.out, args.kind, SHAPES[args.shape]))


if __name__ == "__main__":
    main()
