"""Fixtures for the vLLM tests (the CPU build, in .venv-vllm): a tiny Llama saved in-process (head_dim
64: vLLM's CPU attention rejects 16) and the embedded model converted to safetensors. Nothing here
imports vLLM: the main .venv, which has no vLLM, collects this directory and skips its tests."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from benchmarks.peers.vllm_engines import TINY_VOCAB


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """A tiny random Llama saved as a Hugging Face directory; logits sharpened so greedy text repeats
    itself (drafts get accepted) without ties."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def embedded_dir() -> str:
    """The embedded SmolLM2-135M-Instruct as safetensors (converted once into the cache dir), in the
    form vLLM loads (its tied embedding under vLLM's name)."""
    from specdraft.integrations.vllm import vllm_model_dir
    from specdraft.models import convert_gguf, embedded_gguf

    return str(vllm_model_dir(convert_gguf(embedded_gguf())))
