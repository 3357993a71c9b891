"""A GGUF read natively loads from the file alone (`models.loader._native_from_gguf`): its blocks, and every
other tensor dequantised from it, bitwise what transformers' own conversion holds; only its config,
generation config and tokenizer are cached. Tested on tiny Llama and Qwen2 files (names as
transformers' GGUF loader maps them, q/k rows put back for Llama, kinds the kernel does not read,
biases, norms), on the embedded model and on the real 0.5B (slow: each converted by transformers to
compare with)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft.backend import native as blocks
from specdraft.backend.family import family_of
from specdraft.backend.native.gguf_file import dense_tensor, gguf_blocks, read_gguf, transformers_name
from specdraft.models.gguf_cache import gguf_config_path
from specdraft.models.gguf_check import check_gguf
from specdraft.params import cache_dir
from tests.helpers.tiny import make_tiny_model
from tests.helpers.families import make_tiny_qwen2

gguf = pytest.importorskip("gguf")
from tests.helpers.gguf_files import write_gguf  # noqa: E402 (needs gguf)

TINY = {"llama": lambda: make_tiny_model(seed=5, dtype=torch.float32, layers=2),
        "qwen2": lambda: make_tiny_qwen2(7, 1, 64, seed=5)}
OTHER_KINDS = {"attn_q": "Q5_0", "attn_k": "F16", "ffn_down": "Q5_1", "attn_v": "Q8_0"}  # q/k: rows put back


@pytest.mark.parametrize("family", TINY)
def test_our_names_are_transformers_gguf_loaders(family):
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    model = TINY[family]()
    theirs = get_gguf_hf_weights_map(model, TensorProcessor(), model_type=family)
    assert len(theirs) >= 2 + 9 * 2 and all(transformers_name(g) == hf for g, hf in theirs.items())
    assert transformers_name("rope_freqs.weight") is None and transformers_name("blk.0.attn_qkv.weight") is None


@pytest.mark.parametrize("family", TINY)
def test_a_tiny_files_tensors_read_dense_are_the_models_bitwise(family, tmp_path):
    """Every tensor of the file read dense (blocks too) equals the model holding the file's values:
    gguf's dequantisation of each kind, Llama's q and k (weights and biases) in transformers' order."""
    model = TINY[family]()
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path, types=OTHER_KINDS)
    tensors, described = read_gguf(path, check_gguf(path)), family_of(model.config)
    by_reader = read_gguf(path)  # gguf's own reader finds the same bytes
    assert all(np.array_equal(t.values(), by_reader[name].values()) for name, t in tensors.items())
    state = model.state_dict()
    assert set(tensors) == set(state)
    for name, tensor in tensors.items():
        got = dense_tensor(tensors, name, described)
        assert got.dtype == torch.float32 and torch.equal(got, state[name]), name
    taken = gguf_blocks(tensors, described)
    assert {tensors[name].kind.name for name in taken} <= set(blocks.NAMES.values())
    assert not any("norm" in name or name.endswith(".bias") for name in taken)


def _native_and_converted(path: Path):
    from transformers import AutoModelForCausalLM

    from specdraft.models import convert_gguf, load_model

    native = load_model(str(path), device="cpu", arithmetic="float32", few_rows_linears=False)
    converted = AutoModelForCausalLM.from_pretrained(convert_gguf(path), dtype=torch.float32)
    return native, converted


def _assert_the_rest_is_the_conversions(native, converted):
    """Every parameter and buffer of the native model that is not blocks equals the converted model's,
    bitwise; every converted one is there, or in a block module."""
    ours = dict(itertools.chain(native.model.named_parameters(remove_duplicate=False),
                                native.model.named_buffers(remove_duplicate=False)))
    theirs = dict(itertools.chain(converted.named_parameters(remove_duplicate=False),
                                  converted.named_buffers(remove_duplicate=False)))
    for name, tensor in ours.items():
        if name.endswith(".blocks"):
            continue
        assert tensor.dtype == theirs[name].dtype and torch.equal(tensor, theirs[name]), name
    block_modules = {name for name, m in native.model.named_modules()
                     if isinstance(m, (blocks.BlockLinear, blocks.BlockEmbedding))}
    missing = [name for name in theirs if name not in ours and name.rpartition(".")[0] not in block_modules]
    assert missing == []
    assert _settings(native.model.config) == _settings(converted.config)
    assert native.model.generation_config.to_dict() == converted.generation_config.to_dict()


def _settings(config) -> dict:
    """A config's fields less where it was read from (and its dtype's spelling: a name or a torch dtype)."""
    return {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "dtype")}


@pytest.mark.slow
def test_the_embedded_model_loads_from_its_file_as_its_conversion_holds_it(tmp_path, monkeypatch):
    from specdraft.models.gguf_cache import gguf_cache_path, gguf_config_path
    from specdraft.models import embedded_gguf

    path = embedded_gguf()
    native, converted = _native_and_converted(path)
    assert native.weights == "native" and native.path == path
    assert not (gguf_config_path(path) / "model.safetensors").exists() and gguf_cache_path(path).is_dir()
    _assert_the_rest_is_the_conversions(native, converted)
    assert native.tokenizer.encode("def f(x):\n") == converted_tokenizer(path).encode("def f(x):\n")


def converted_tokenizer(path: Path):
    from transformers import AutoTokenizer

    from specdraft.models.gguf_cache import gguf_cache_path

    return AutoTokenizer.from_pretrained(gguf_cache_path(path))


@pytest.mark.slow
def test_the_real_05b_loads_from_its_file_as_its_conversion_holds_it():
    """Its Q5_0/Q4_K/Q6_K projections and tied Q5_0 embedding (dense until the kernel reads them) and
    its q/k/v biases, read from the file, are its conversion's."""
    path = cache_dir() / "catalogue" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip("the 0.5B is not cached here")
    native, converted = _native_and_converted(path)
    _assert_the_rest_is_the_conversions(native, converted)


def test_a_native_load_caches_only_the_config_and_tokenizer(tmp_path, monkeypatch):
    """Into its own directory, atomically (nothing else left beside it), and reused: the second load
    reads no GGUF metadata through transformers."""
    from transformers import AutoConfig

    from specdraft.models import embedded_gguf, loader

    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "convert_gguf", lambda path: pytest.fail("a native load converted the file"))
    path = embedded_gguf()
    first = loader.load_model(str(path), device="cpu", arithmetic="float32")
    assert first.weights == "native" and first.path == path
    cached = gguf_config_path(path)
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= {p.name for p in cached.iterdir()}
    assert sum(p.stat().st_size for p in cached.iterdir()) < 20e6
    monkeypatch.setattr(AutoConfig, "from_pretrained", _refusing_gguf(AutoConfig.from_pretrained))
    again = loader.load_model(str(path), device="cpu", arithmetic="float32")
    assert torch.equal(again.model.model.norm.weight, first.model.model.norm.weight)


def _refusing_gguf(read):
    def refuse(*args, **kwargs):
        assert "gguf_file" not in kwargs, "the GGUF's metadata was read again"
        return read(*args, **kwargs)
    return refuse


def _mappings(path: Path) -> list[int]:
    """The sizes of this process's mappings of `path` (/proc/self/maps)."""
    sizes = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(" " + str(path)):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            sizes.append(end - start)
    return sizes


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_tensor_keeps_only_its_own_pages_mapped(tmp_path):
    """Each tensor is mapped on its own: what a model keeps of the file (an untied embedding read by
    rows) keeps that tensor mapped, not the whole file, and a tensor dropped leaves the process."""
    import gc
    import shutil

    from specdraft.models import embedded_gguf

    path = tmp_path / "copy.gguf"
    shutil.copyfile(embedded_gguf(), path)
    tensors = read_gguf(path, check_gguf(path))
    assert len(_mappings(path)) == len(tensors)
    kept = tensors["model.layers.0.mlp.down_proj.weight"].data
    del tensors
    gc.collect()
    [size] = _mappings(path)
    assert kept.nbytes <= size < kept.nbytes + 2 * 4096
    del kept
    gc.collect()
    assert _mappings(path) == []


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_int8_tiles_lie_in_one_buffer_in_the_order_a_step_reads_them(tmp_path):
    """Tiled once onto 2 MB pages (`use_arithmetic`), nothing of the file left mapped, each layer's
    q/k/v and gate/up one joined view (no joined copy made when the CPU step is built)."""
    import gc
    import shutil

    from specdraft.backend.weights import adjacent_view
    from specdraft.models import embedded_gguf, load_model

    path = tmp_path / "copy.gguf"
    shutil.copyfile(embedded_gguf(), path)
    model = load_model(str(path), device="cpu", arithmetic="int8").model
    gc.collect()
    assert _mappings(path) == []
    linears = [m for m in model.modules() if isinstance(m, blocks.BlockLinear)]
    assert all(m.blocks._on_huge_pages and m.arithmetic == "int8" for m in linears)
    assert len({m.blocks.untyped_storage().data_ptr() for m in linears}) == 1
    for layer in model.model.layers:
        mlp, attention = layer.mlp, layer.self_attn
        assert adjacent_view([mlp.gate_proj.blocks, mlp.up_proj.blocks]) is not None
        assert adjacent_view([attention.q_proj.blocks, attention.k_proj.blocks, attention.v_proj.blocks]) is not None
    assert model.model.embed_tokens.blocks is model.lm_head.blocks  # tied: tiled once, read by both


def test_a_fast_tokenizer_drops_its_construction_tables_and_tokenizes_as_before():
    """The Python vocabulary and merges a fast BPE tokenizer (Qwen2's) was built from are dropped:
    read by its constructor alone, what it encodes, decodes and lists is unchanged."""
    from transformers import Qwen2Tokenizer

    from specdraft.models.gguf_cache import lean_tokenizer

    vocab = {c: i for i, c in enumerate(["a", "b", "c", "d", "ab", "abc", "Ġ", "Ġa", "<|endoftext|>"])}
    fresh = Qwen2Tokenizer(vocab=dict(vocab), merges=[("a", "b"), ("ab", "c"), ("Ġ", "a")])
    text = "abc a abd dab"
    ids, listed = fresh.encode(text), fresh.get_vocab()
    lean = lean_tokenizer(fresh)
    assert not hasattr(lean, "_merges") and not hasattr(lean, "_vocab")
    assert lean.encode(text) == ids == [5, 7, 6, 4, 3, 6, 3, 4] and lean.decode(ids) == text
    assert lean.get_vocab() == listed


def test_a_gguf_models_tokenizer_tokenizes_as_a_fresh_one():
    """The embedded model's tokenizer as a load gives it encodes, decodes and templates as one loaded
    afresh from the same files."""
    from transformers import AutoTokenizer

    from specdraft.models.gguf_cache import cache_gguf_config, gguf_tokenizer
    from specdraft.models import embedded_gguf

    source = cache_gguf_config(embedded_gguf())
    ours, fresh = gguf_tokenizer(source), AutoTokenizer.from_pretrained(source, local_files_only=True)
    text = "def f(x):\n    return {'ключ': x ** 2}  # ✓ ok"
    assert ours.encode(text) == fresh.encode(text) and ours.decode(ours.encode(text)) == text
    assert ours.get_vocab() == fresh.get_vocab()
    chat = [{"role": "user", "content": text}]
    assert ours.apply_chat_template(chat, tokenize=False) == fresh.apply_chat_template(chat, tokenize=False)
