"""What a GGUF leaves in the cache dir (`SPECDRAFT_CACHE_DIR`, default `~/.cache/specdraft`), each
made once, atomically: its config, generation config and tokenizer for a native load
(`cache_gguf_config`), its dense conversion for a dense one (`convert_gguf`); and a tokenizer read
from such a config, shared by models whose tokenizer files are the same (`gguf_tokenizer`)."""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Callable

import torch

from specdraft.params import cache_dir


PATH_HEX = 12  # hex digits of a cache directory's name that name the file's path
VERSION_HEX = 8  # and its version (its size and time of change)


def _gguf_key(gguf: Path) -> str:
    """A cache directory's name for a GGUF: `{stem}-{path}-{version}`, hashes of its path, and of its
    size and time of change (a file changed in place, or fetched again, gets a new directory, and the
    one made for its earlier version goes: `_drop_earlier`)."""
    stat = gguf.stat()
    where = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:PATH_HEX]
    version = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:VERSION_HEX]
    return f"{gguf.stem}-{where}-{version}"


def gguf_cache_path(gguf: Path) -> Path:
    """Where a GGUF's dense conversion is cached (`convert_gguf`)."""
    return cache_dir() / "models" / _gguf_key(gguf)


def gguf_config_path(gguf: Path) -> Path:
    """Where a GGUF's config, generation config and tokenizer are cached for a native load (`cache_gguf_config`)."""
    return cache_dir() / "gguf-configs" / _gguf_key(gguf)


def _write_once(target: Path, write: Callable[[Path], None]) -> Path:
    """Make the cache directory `target` atomically: `write` fills a temporary directory beside it,
    which is then renamed to it, unless another process finished first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / "done"
        staged.mkdir()
        write(staged)
        try:
            staged.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    _drop_earlier(target)
    return target


def _drop_earlier(target: Path) -> None:
    """Remove what was made for an earlier version of the same file (its path's name, another version),
    and what was made, under the same stem, when a name held one hash of path, size and time of change."""
    prefix = target.name[:-VERSION_HEX]
    stem = prefix[:-(PATH_HEX + 2)]
    unversioned = re.compile(re.escape(stem) + r"-[0-9a-f]{16}")
    for earlier in target.parent.iterdir():
        same_file = earlier.name.startswith(prefix) and len(earlier.name) == len(target.name)
        if earlier != target and (same_file or unversioned.fullmatch(earlier.name)):
            shutil.rmtree(earlier, ignore_errors=True)


def cache_gguf_config(gguf: Path) -> Path:
    """Read a GGUF's config, generation config and tokenizer once (transformers parses its metadata)
    into a small cached Hugging Face directory, without weights; return that directory."""
    target = gguf_config_path(gguf)
    if (target / "config.json").is_file():
        return target
    from transformers import AutoTokenizer, GenerationConfig

    def write(into: Path) -> None:
        config = gguf_config(gguf)
        if hasattr(config, "quantization_config"):  # the weights load as float32; no GGUF quantizer
            del config.quantization_config
        config.save_pretrained(into)
        GenerationConfig.from_model_config(config).save_pretrained(into)  # as transformers makes a GGUF model's
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(into)

    print(f"Reading {gguf.name}'s config and tokenizer once into {target}", file=sys.stderr)
    return _write_once(target, write)


def gguf_config(gguf: Path):
    """A GGUF's config as transformers reads its metadata, with a head's size set from the file's
    `attention.key_length` where the config has a field for it that transformers leaves at its
    default (Qwen3's: 128 whatever the file says), and what it leaves unread of Phi-3's files: a rotary
    embedding over part of each head (`rope.dimension_count`), LongRoPE (`long_rope.rope_parameters_of`).
    (`check_gguf` has refused such a file of any other family.)"""
    from gguf import GGUFReader
    from transformers import AutoConfig

    from specdraft.models.long_rope import rope_parameters_of

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    reader = GGUFReader(str(gguf))
    architecture = reader.get_field("general.architecture").contents()
    field = reader.get_field(f"{architecture}.attention.key_length")
    if field is not None and hasattr(config, "head_dim"):
        config.head_dim = int(field.contents())
    turned = reader.get_field(f"{architecture}.rope.dimension_count")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if turned is not None and int(turned.contents()) != head_dim:  # a partial rotary (Phi-4-mini), unread
        config.rope_parameters = {**config.rope_parameters, "partial_rotary_factor": int(turned.contents()) / head_dim}
    long_rope = rope_parameters_of(reader, config)
    if long_rope is not None:  # Phi3Config puts its own original context into its rope parameters: both, then
        config.rope_parameters = {**config.rope_parameters, **long_rope}
        config.original_max_position_embeddings = long_rope["original_max_position_embeddings"]
    return config


def convert_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF once into a cached Hugging Face directory; return that directory."""
    target = gguf_cache_path(gguf)
    if (target / "model.safetensors").is_file():
        return target
    from safetensors.torch import save_model
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def write(into: Path) -> None:
        with tqdm(total=3, desc="convert GGUF", unit="step") as bar:
            bar.set_postfix_str("tokenizer")
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(into)
            bar.update()
            bar.set_postfix_str("weights")
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                         config=gguf_config(gguf))
            bar.update()
            bar.set_postfix_str("save")
            # The weights are dequantised already; drop the GGUF quantizer so the config reloads as plain fp32.
            config = copy.deepcopy(model.config)
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.save_pretrained(into)
            model.generation_config.save_pretrained(into)
            save_model(model, str(into / "model.safetensors"))
            bar.update()

    print(f"Converting {gguf.name} once into {target} (later loads take seconds)", file=sys.stderr)
    return _write_once(target, write)


_TOKENIZERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # tokenizer files' hash -> a live tokenizer


def gguf_tokenizer(source: Path):
    """The tokenizer of a cached GGUF config (`cache_gguf_config`): where one loaded from files of
    the same content lives (a drafter of the target's family: building one takes a second), a
    shallow copy of it holding this model's own chat template (the same vocabulary, merges and
    special tokens; nothing changes them once loaded), else one loaded."""
    from transformers import AutoTokenizer

    digest = hashlib.sha256()
    for path in sorted(source.glob("*.json")):
        if path.name.startswith(("tokenizer", "special_tokens", "added_tokens")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()
    loaded, template = _TOKENIZERS.get(key), source / "chat_template.jinja"
    if loaded is None or not template.is_file():
        tokenizer = _TOKENIZERS[key] = lean_tokenizer(AutoTokenizer.from_pretrained(source, local_files_only=True))
        return tokenizer
    tokenizer = copy.copy(loaded)
    tokenizer.chat_template = template.read_text()
    return tokenizer


# What transformers' BPE tokenizers (Qwen2's, GPT-2's, Llama's) keep of the tables they built their
# Rust tokenizer from, as Python objects read by their constructors alone.
_CONSTRUCTION_TABLES = ("_vocab", "_merges")


def lean_tokenizer(tokenizer):
    """`tokenizer` without the Python copies of its vocabulary and merges that a fast tokenizer keeps
    after building its Rust tokenizer from them (`_CONSTRUCTION_TABLES`: 65 MB resident for Qwen2's
    151,936 tokens). Encoding, decoding, `get_vocab` and saving read the Rust tokenizer."""
    if getattr(tokenizer, "is_fast", False):
        for name in _CONSTRUCTION_TABLES:
            if name in vars(tokenizer):
                delattr(tokenizer, name)
    return tokenizer
