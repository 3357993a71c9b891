"""The Hugging Face peers decode plain greedy whatever the checkpoint's generation_config says, and
their prompt lookup and assisted generation reproduce plain generate token for token."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from benchmarks.peers import hf as peers

PROMPT = [3, 7, 9, 11, 3, 7, 9, 11, 3, 7, 9]  # repeats, so prompt lookup finds matches to draft


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # sharp logits: varied greedy continuations, no near-ties
    # A checkpoint that asks for sampling, penalties, and an EOS that greedy decoding reaches early:
    # the peers must ignore all of them (eos_token_id=None means no EOS, as in our engine).
    early_token = argmax_loop(model, PROMPT, 4)[2]
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, top_k=20,
                                               repetition_penalty=1.3, no_repeat_ngram_size=2,
                                               eos_token_id=early_token)
    return model


def argmax_loop(model, prompt, max_new_tokens, eos=()):
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in eos:
                break
    return out


def test_generate_is_plain_greedy_with_timing(model):
    result = peers.hf_generate(model, PROMPT, 24, None)
    assert result.token_ids == argmax_loop(model, PROMPT, 24)
    assert result.seconds > 0 and result.tokens_per_second == pytest.approx(24 / result.seconds)


@pytest.mark.parametrize("num_tokens", [10, 3])
def test_prompt_lookup_equals_generate(model, num_tokens):
    plain = peers.hf_generate(model, PROMPT, 32, None)
    lookup = peers.hf_prompt_lookup(model, PROMPT, 32, None, num_tokens=num_tokens)
    assert lookup.token_ids == plain.token_ids


def test_assisted_equals_generate(model):
    assert peers.hf_assisted(model, model, PROMPT, 24, None).token_ids == peers.hf_generate(model, PROMPT, 24, None).token_ids


def test_stops_at_any_eos_and_keeps_it(model):
    reference = argmax_loop(model, PROMPT, 24)
    eos = reference[5]
    expected = reference[: reference.index(eos) + 1]
    for fn in (peers.hf_generate, peers.hf_prompt_lookup):
        assert fn(model, PROMPT, 24, eos).token_ids == expected
        assert fn(model, PROMPT, 24, (255, eos)).token_ids == expected


def test_bad_arguments_are_named(model):
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        peers.hf_generate(model, PROMPT, 0, None)
    with pytest.raises(ValueError, match="num_tokens must be >= 1, got 0"):
        peers.hf_prompt_lookup(model, PROMPT, 8, None, num_tokens=0)
