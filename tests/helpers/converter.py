"""llama.cpp's own converter (`convert_hf_to_gguf.py`, with its `conversion` package and `gguf-py`),
taken once from the `llama-cpp-python` sdist's vendor tree into the cache dir (`converter_tree`; a
test skips, saying why, where PyPI cannot be reached), run on a folder (`convert`), and tiny random
Hugging Face models of each family, at a real tokenizer whose pre-tokenizer the converter knows
(`tiny_family_dir`; Phi-3's a SentencePiece tokenizer trained here, `_sentencepiece_tokenizer`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import torch

from specdraft.params import cache_dir

SDIST = "llama-cpp-python==0.3.36"  # the llama.cpp the benchmarks build (`benchmarks/results/int8/README.md`)
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")  # under vendor/llama.cpp/


def converter_tree() -> Path:
    """The converter's files, fetched and unpacked once (the sdist is 77 MB; only these are kept)."""
    tree = cache_dir() / "tools" / SDIST.replace("==", "-")
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    with tempfile.TemporaryDirectory() as scratch:
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "-q", SDIST, "--no-binary", ":all:",
                                  "--no-deps", "-d", scratch], capture_output=True, text=True)
        if fetched.returncode != 0:
            pytest.skip(f"llama.cpp's converter could not be fetched ({SDIST} from PyPI): {fetched.stderr[-300:]}")
        (sdist,) = Path(scratch).glob("*.tar.gz")
        partial = tree.with_name(f"{tree.name}.partial-{os.getpid()}")
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                inner = member.name.partition("/vendor/llama.cpp/")[2]
                if inner.startswith(_MEMBERS) and (member.isfile() or member.isdir()):
                    member.name = inner
                    archive.extract(member, partial, filter="data")
    try:
        os.replace(partial, tree)
    except OSError:  # another process unpacked it first
        shutil.rmtree(partial)
    return tree


def convert(model_dir: Path, out: Path, outtype: str = "q8_0") -> Path:
    """`model_dir` (a Hugging Face directory) as llama.cpp's converter writes it, at `outtype`."""
    tree = converter_tree()
    env = dict(os.environ, PYTHONPATH=f"{tree / 'gguf-py'}{os.pathsep}{tree}")
    done = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", outtype,
                           "--outfile", str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


LLAMA_CPP_BIN = "SPECDRAFT_LLAMA_CPP_BIN"  # a llama.cpp build's bin folder (benchmarks/results/cpu/int8/README.md)


def llama_quantize(source: Path, out: Path, kind: str) -> Path:
    """`source` (a GGUF) quantised to `kind` (Q4_K_M, IQ4_XS, ...) by llama.cpp's own `llama-quantize`, from
    the benchmark-only build whose bin folder SPECDRAFT_LLAMA_CPP_BIN names; a test skips, saying why,
    where none is named (building llama.cpp takes minutes a machine, more than a test run affords)."""
    folder = os.environ.get(LLAMA_CPP_BIN)
    tool = Path(folder or ".") / "llama-quantize"
    if not folder or not tool.is_file():
        pytest.skip(f"no llama-quantize: set {LLAMA_CPP_BIN} to the bin folder of a llama.cpp build "
                    f"(benchmarks/results/cpu/int8/README.md), {'not set' if not folder else f'{tool} is missing'}")
    done = subprocess.run([str(tool), str(source), str(out), kind, "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def tiny_family_dir(family: str, path: Path, seed: int = 0, **shape) -> Path:
    """A random model of `family` (llama: 2 layers, a tied head; qwen2: q/k/v biases; qwen3: q/k norms,
    heads wider than hidden / heads; gemma3_text: 6 layers, 5 sliding over 8 tokens, heads of 256; phi3:
    q/k/v and gate/up fused, a sliding window its file keeps and llama.cpp ignores) at a real tokenizer's
    vocabulary (`_tokenizer_source`; Phi-3's kind trained here), with it; `shape`: config fields in place
    of the tiny ones (hidden_size 256 for rows of whole K super-blocks)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    if family == "phi3":
        vocab, bos, eos = _sentencepiece_tokenizer(path)
        tokenizer = None
    else:
        tokenizer = AutoTokenizer.from_pretrained(_tokenizer_source(family))
        vocab, bos, eos = len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 bos_token_id=bos, eos_token_id=eos) | shape
    own = {"llama": dict(tie_word_embeddings=True), "qwen2": dict(tie_word_embeddings=False),
           "qwen3": dict(tie_word_embeddings=False, head_dim=32),
           # Gemma 3's files hold no layer pattern (llama.cpp and transformers take 5 sliding layers, then a
           # full one), nor query_pre_attn_scalar (transformers takes 256; llama.cpp, the head size)
           "gemma3_text": dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=8, num_hidden_layers=6),
           "phi3": dict(tie_word_embeddings=False, sliding_window=8, pad_token_id=eos)}[family]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **{**shape, **own})).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight", "layernorm.weight")):
                tensor.normal_(1.0, 0.3)  # norms that matter
            elif name.endswith(".bias"):
                tensor.normal_(0.0, 0.5)
        model.get_input_embeddings().weight.mul_(8.0)  # varied greedy continuations, not ties
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def _sentencepiece_tokenizer(folder: Path) -> tuple[int, int, int]:
    """Phi-3's kind of tokenizer (a SentencePiece BPE with byte fallback, as Llama 2's), trained on this
    project's docs into `folder` as the converter reads it (tokenizer.model, and tokenizer_config.json
    naming its class): (vocabulary size, bos id, eos id)."""
    import json

    import sentencepiece

    docs = Path(__file__).resolve().parents[2] / "docs"
    lines = [line for doc in sorted(docs.glob("*.md")) for line in doc.read_text().splitlines() if line.strip()]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(folder / "tokenizer"), vocab_size=640, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True}))
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    return processor.get_piece_size(), processor.bos_id(), processor.eos_id()


def _tokenizer_source(family: str) -> Path:
    """A folder of the tokenizer a tiny model of `family` gets, one whose pre-tokenizer the converter
    knows: the embedded SmolLM2's for Llama (read through `llama_hf`), Qwen2.5's for the Qwen families
    (the converter checks its hash; the catalogue's 0.5B, fetched by name where it is not cached)."""
    from specdraft.errors import ModelFetchError
    from specdraft.models import embedded_gguf
    from specdraft.models.find import fetch
    from specdraft.models.gguf_cache import cache_gguf_config

    if family == "llama":
        return cache_gguf_config(embedded_gguf())
    try:
        return cache_gguf_config(fetch("qwen2.5-coder-0.5b-instruct", progress=False))
    except ModelFetchError as error:
        pytest.skip(f"Qwen2.5's tokenizer could not be fetched (the catalogue's 0.5B): {error}")
