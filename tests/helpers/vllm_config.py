"""A fake vLLM config: the few fields specdraft's vLLM `Proposer` reads, without vLLM."""

from __future__ import annotations

from types import SimpleNamespace


def fake_vllm_config(k: int = 4, max_model_len: int = 256, eos=7, additional_config=None) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=max_model_len, hf_config=SimpleNamespace(eos_token_id=eos)),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        additional_config=additional_config or {},
    )
