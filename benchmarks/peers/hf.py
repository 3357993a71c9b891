"""The peers people would otherwise use: Hugging Face `generate`, greedy, on one prompt.

Each function runs batch 1 from prompt token ids and returns the new token ids (the prompt left
out, an EOS that stopped generation kept, as our engine keeps it) with the wall time of the call.
Whatever the model's `generation_config` says, decoding is plain greedy argmax with the EOS ids
given here (an id, a sequence of ids, or None for none), so every peer's output can be compared
token for token with ours.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

# Every knob a checkpoint's generation_config may set is given explicitly, so decoding is plain argmax
# whatever the checkpoint says. Sampling knobs are inert at do_sample=False; they take Hugging Face's
# global defaults only so generate does not warn about a checkpoint's sampling values.
_GREEDY = dict(
    do_sample=False,
    num_beams=1,
    temperature=1.0,
    top_k=50,
    top_p=1.0,
    min_p=None,
    typical_p=1.0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    bad_words_ids=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    min_new_tokens=0,
)


@dataclass(frozen=True)
class PeerResult:
    token_ids: list[int]  # generated ids, prompt excluded
    seconds: float  # wall time of the generate call, input transfer included

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


def _eos_list(eos_token_id: int | Sequence[int] | None) -> list[int] | None:
    if eos_token_id is None:
        return None
    if not hasattr(eos_token_id, "__iter__"):  # one id, e.g. an int or a numpy integer
        return [int(eos_token_id)]
    ids = [int(t) for t in eos_token_id]
    return ids or None


def _generate(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id, **extra) -> PeerResult:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids must not be empty")
    eos = _eos_list(eos_token_id)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0  # batch 1 never pads; set only to keep generate quiet
    with torch.inference_mode():
        start = time.perf_counter()
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)  # [1, prompt]
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            **_GREEDY,
            **extra,
        )
        token_ids = out[0, input_ids.shape[1] :].tolist()  # the one device-to-host copy; syncs the device
        seconds = time.perf_counter() - start
    return PeerResult(token_ids, seconds)


def hf_generate(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id) -> PeerResult:
    """Plain greedy `generate`: the baseline people know, and the reference output for the lossless check."""
    return _generate(model, prompt_ids, max_new_tokens, eos_token_id)


def hf_prompt_lookup(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id, num_tokens: int = 10) -> PeerResult:
    """`generate` with prompt lookup decoding: drafts of `num_tokens` (Hugging Face's default is 10)
    copied from earlier in the context, matched on n-grams of up to 2 tokens (its default)."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    return _generate(model, prompt_ids, max_new_tokens, eos_token_id, prompt_lookup_num_tokens=num_tokens)


def hf_assisted(model, assistant_model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id) -> PeerResult:
    """`generate` with a draft model (assisted generation) at Hugging Face's default draft schedule.

    The assistant must share the target's tokenizer.
    """
    return _generate(model, prompt_ids, max_new_tokens, eos_token_id, assistant_model=assistant_model)
