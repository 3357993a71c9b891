"""The tests' shared makings: a tiny random Llama built in-process (`make_tiny_model`, and copies of
some of its layers), Hugging Face's greedy output as the reference, a toy tokenizer, scripted drafters,
and a model wrapped as the loader returns one. Fixtures over them live in `tests/conftest.py`."""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import torch

from specdraft.drafters.base import EMPTY_DRAFT, Draft, Parts
from specdraft.params import SamplingParams

TINY_VOCAB = 96
# The tiny-model tests run on CPU (CI); SPECDRAFT_TEST_DEVICE=cuda runs the same tests on a GPU.
TEST_DEVICE = torch.device(os.environ.get("SPECDRAFT_TEST_DEVICE", "cpu"))


class ToyTokenizer:
    """Token i decodes to one printable character; enough for detokenization and stop strings."""

    eos_token_id = bos_token_id = pad_token_id = unk_token_id = None
    chat_template = None

    def decode(self, ids: Sequence[int], **_) -> str:
        return "".join(chr(32 + int(i) % 95) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [(ord(c) - 32) % TINY_VOCAB for c in text]

    def __call__(self, text: str):
        class Out:
            input_ids = [ord(c) - 32 for c in text]

        return Out()


class GrammarTokens:
    """The toy tokenizer as llguidance's `TokenizerWrapper` sees it (structured output on tiny models):
    tokens 0..94 are the printable ASCII characters, token 95 (`GRAMMAR_EOS`) ends a sequence."""

    eos_token_id = 95
    bos_token_id = None
    special_token_ids = [95]
    tokens = [bytes([32 + i]) for i in range(95)] + [b"<eos>"]

    def __call__(self, text: str | bytes) -> list[int]:
        return [ord(c) - 32 for c in (text.decode() if isinstance(text, bytes) else text)]
GRAMMAR_EOS = GrammarTokens.eos_token_id


def make_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64, sharpen: float = 40.0, layers: int = 2,
                    vocab_size: int = TINY_VOCAB, **config_overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        **config_overrides,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    # Random init gives nearly flat logits; sharpen them so greedy continuations are varied, not ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model.to(TEST_DEVICE)


def row_passes(rows, prompt: list[int], counts: list[int], generations: list[int] | None = None) -> list[torch.Tensor]:
    """Logits of one row of a `RowModel` fed `prompt`, then passes of `counts` random tokens each
    (committed); the cache's generation (how often it was allocated) after each pass goes to `generations`."""
    rows.add("r", active=True)
    rows.prefill("r", prompt)
    out, rng = [], np.random.default_rng(0)
    for n in counts:
        ids = rng.integers(0, TINY_VOCAB, size=(1, n))
        out.append(rows.forward(rows.active_window, ids).clone())
        rows.commit(rows.active_window, [n])
        if generations is not None:
            generations.append(rows.cache.generation)
    return out


def hf_greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Reference: Hugging Face generate, greedy, on the prompt alone."""
    input_ids = torch.tensor([list(prompt_ids)], device=model.device)
    with torch.inference_mode():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),  # else generate masks prompt tokens equal to pad_token_id
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, len(prompt_ids) :].tolist()


class ScriptedDrafter:
    """Drafts from a function of the request's context: `script(context, max_len) -> tokens`. Declared
    free, so that the policy never weighs calling it (tests of undeclared drafters use their own)."""

    @property
    def parts(self) -> Parts:
        return Parts(self, free_cost="free")

    def __init__(self, script: Callable[[list[int], int], Sequence[int]]) -> None:
        self.script = script
        self.contexts: dict[str, list[int]] = {}
        self.ended: list[str] = []

    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        self.contexts[request_id] = list(prompt_ids)

    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        drafts = []
        for request_id, limit in zip(request_ids, max_lengths):
            tokens = list(self.script(self.contexts[request_id], limit))[:limit]
            drafts.append(Draft(np.asarray(tokens, dtype=np.int32)) if tokens else EMPTY_DRAFT)
        return drafts

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.contexts[request_id].extend(token_ids)

    def end(self, request_id: str) -> None:
        self.ended.append(request_id)
        del self.contexts[request_id]


def oracle_script(references: dict[tuple, list[int]], corrupt: Callable[[int, int], bool]):
    """Drafts the true greedy continuation, corrupting position i of step s when corrupt(s, i).

    references maps a prompt (tuple) to its plain greedy continuation.
    """
    steps = {"n": 0}

    def script(context: list[int], limit: int) -> list[int]:
        for prompt, continuation in references.items():
            if tuple(context[: len(prompt)]) == prompt:
                done = len(context) - len(prompt)
                truth = continuation[done : done + limit]
                break
        else:
            return []
        steps["n"] += 1
        return [(t + 1) % TINY_VOCAB if corrupt(steps["n"], i) else t for i, t in enumerate(truth)]

    return script


def loaded(model, name: str = "tiny", tokenizer=None, eos: tuple[int, ...] = ()):
    """Wrap an in-process model as the loader would return it."""
    from specdraft.models import LoadedModel

    return LoadedModel(model, tokenizer or ToyTokenizer(), name, None, model.config.max_position_embeddings, eos)


def shallow_copy_of(model, keep: Sequence[int], seed: int = 99):
    """A draft model: a new model with `len(keep)` layers holding the given layers of `model` (and its
    embeddings, norm and output layer), so its predictions are related to the target's."""
    draft = make_tiny_model(seed=seed, dtype=next(model.parameters()).dtype, layers=len(keep),
                            vocab_size=model.config.vocab_size)
    state = {}
    for key, value in model.state_dict().items():
        if ".layers." in key:
            index = int(key.split(".layers.")[1].split(".")[0])
            if index not in keep:
                continue
            key = key.replace(f".layers.{index}.", f".layers.{list(keep).index(index)}.")
        state[key] = value
    draft.load_state_dict(state)
    return draft


def feed(model, prompt: np.ndarray, extra: np.ndarray, chunk: int, widths: list[int]):
    """Prefill `prompt` in chunks of `chunk`, then feed `extra` in passes of `widths`: every token's
    logits [tokens, vocab] and the row's keys and values."""
    from specdraft.backend import RowModel

    rows = RowModel(model, compiled=True)
    rows.add("r", active=True)
    window, out, done = rows.active_window, [], 0
    for start in range(0, len(prompt), chunk):
        piece = prompt[None, start : start + chunk]
        out.append(rows.forward(window, piece)[0].clone())
        rows.commit(window, [piece.shape[1]])
    for width in widths:
        out.append(rows.forward(window, extra[None, done : done + width])[0].clone())
        rows.commit(window, [width])
        done += width
    cache = torch.stack([torch.stack(rows.cache.entries(layer, 0)) for layer in range(rows.cache.num_layers)])
    return torch.cat(out), cache
