"""A Llama-shaped GGUF of random weights with its projections in one block kind, for timing a kind beside
llama.cpp on the same file (`benchmarks.cpu.int8_speed --model FILE --llama-bench PATH`).

One layer's projections are random normals quantised by gguf (`quantize`: `gguf.quants.quantize`, or
for IQ4_NL, which gguf does not quantise, each weight's nearest point of its grid), written for
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
    IQ4_NL's (not gguf's): per block of 32, d = -(the weight of largest magnitude) / 127, so that it lies
    on the grid's -127, and each weight the nearest of d times the grid's 16 values (llama.cpp then
    refines d; any d gives valid blocks)."""
    if type_name != "IQ4_NL":
        return gguf.quants.quantize(values, getattr(gguf.GGMLQuantizationType, type_name))
    from specdraft.backend.native.formats import IQ4_NL_VALUES

    grid = np.asarray(IQ4_NL_VALUES, np.float32)
    blocks = values.reshape(values.shape[0], -1, 32)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)  # [rows, blocks, 1]
    d = (extreme / -127).astype(np.float16)
    scaled = blocks / np.where(d == 0, 1, d).astype(np.float32)
    q = np.abs(scaled[..., None] - grid).argmin(-1).astype(np.uint8)  # [rows, blocks, 32]
    packed = q[..., :16] | (q[..., 16:] << 4)
    return np.concatenate([d.view(np.uint8), packed], axis=-1).reshape(values.shape[0], -1)


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
    parser.add_argument("--kind", required=True, help="a GGUF block type: Q4_0, Q5_1, Q4_K ...")
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(write_kind_file(args.out, args.kind, SHAPES[args.shape]))


if __name__ == "__main__":
    main()
