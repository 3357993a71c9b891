"""A tiny model directory to serve fast (a random 2-layer Llama with the embedded model's tokenizer
and chat template); the server process itself: `benchmarks.common.live_server`."""

from __future__ import annotations

from pathlib import Path


def tiny_model_dir(path: Path) -> Path:
    """A random 2-layer Llama at the embedded model's vocabulary, with its tokenizer: served in
    milliseconds per token, for tests that exercise the API rather than the model."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from specdraft.models import convert_gguf, embedded_gguf

    source = convert_gguf(embedded_gguf())
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
