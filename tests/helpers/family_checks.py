"""The checks every family's tests run on a tiny model of it (`tests/backend/test_qwen2.py`, `_qwen3`,
`_gemma3`, `_sliding_window`): our forward against the stock model across rows and a packed pass,
numba's compiled layers (and inductor's parts) against the eager ones for every token count, verify
passes against plain steps bitwise, greedy speculative output against plain and Hugging Face's."""

from __future__ import annotations

import random

import numpy as np
import torch

from specdraft.backend import RowModel
from specdraft.backend.numba_layers import MAX_TOKENS, NumbaLayers
from tests.helpers.passes import speculative_and_plain, stock_logits
from tests.helpers.tiny import TINY_VOCAB, feed, hf_greedy, row_passes


def own_forward_equals_stock(model, atol: float, rows: int = 4, longest: int = 40) -> None:
    """Rows of random contexts (up to `longest` tokens), each prefilled in chunks of 7, then one packed
    pass feeding each a different number of tokens: every logit the stock model's, to `atol`."""
    model_rows = RowModel(model, prefill_chunk=7)
    assert model_rows.own_forward
    rng = random.Random(0)
    contexts = {f"r{i}": [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(2, longest))] for i in range(rows)}
    for row_id, ids in contexts.items():
        model_rows.add(row_id, active=True)
        torch.testing.assert_close(model_rows.prefill(row_id, ids), stock_logits(model, ids)[-1], rtol=0, atol=atol)
    counts = [1, 4, 2, 3][:rows]
    inputs = np.array([[rng.randrange(TINY_VOCAB) for _ in range(4)] for _ in counts], dtype=np.int64)
    flat = np.concatenate([inputs[b, :n] for b, n in enumerate(counts)])
    logits = model_rows.packed_pass(model_rows.active_window, flat, np.array(counts)).logits  # fed tokens only
    starts = np.cumsum([0] + counts)
    for b, ids in enumerate(contexts.values()):
        real = inputs[b, : counts[b]].tolist()
        torch.testing.assert_close(logits[starts[b] : starts[b + 1]], stock_logits(model, ids + real)[len(ids):],
                                   rtol=0, atol=atol)


def numba_equals_eager(model, atol: float) -> None:
    """Passes of every token count up to past `MAX_TOKENS`, past the cache's first 64 and 128 positions:
    numba's compiled layers give the eager layers' logits to `atol`, and the same greedy choices."""
    counts = [1, 2, 3, 6, 7, 1, MAX_TOKENS, MAX_TOKENS + 3, 1, 5]
    compiled = RowModel(model, compiled=True)
    assert isinstance(compiled.compiled_layers, NumbaLayers)
    reference = row_passes(RowModel(model), list(range(1, 61)), counts)
    for n, got, want in zip(counts, row_passes(compiled, list(range(1, 61)), counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def inductor_equals_eager(model, prompt: list[int], monkeypatch) -> None:
    """Float32 layers on inductor's parts (numba's kept off, as int8 and bf16 layers are): passes of
    every compiled token count after `prompt` give the eager layers' logits, and the same greedy choices."""
    from specdraft.backend.inductor import InductorLayers

    monkeypatch.setattr(NumbaLayers, "applies", staticmethod(lambda *args: False))
    compiled = RowModel(model, compiled=True)
    assert isinstance(compiled.compiled_layers, InductorLayers)
    counts = [1, 3, 8, 2]
    reference = row_passes(RowModel(model), prompt, counts)
    for n, got, want in zip(counts, row_passes(compiled, prompt, counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=5e-5, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert compiled.compiled_layers.failed is None


def verify_passes_equal_plain_steps(model) -> None:
    """After the same prefill of 140 tokens, passes of 2..6 tokens give the logits and entries one-token
    steps give, bitwise."""
    rng = np.random.default_rng(1)
    prompt, extra = rng.integers(0, TINY_VOCAB, size=140), rng.integers(0, TINY_VOCAB, size=18)
    reference = feed(model, prompt, extra, len(prompt), [1] * len(extra))
    for widths in ([3, 5, 4, 6], [6, 6, 6], [2] * 9):
        logits, cache = feed(model, prompt, extra, len(prompt), widths)
        assert torch.equal(cache, reference[1]), f"keys/values differ: passes {widths}"
        assert torch.equal(logits, reference[0]), f"logits differ: passes {widths}"


def greedy_equals_plain_and_hugging_face(model, prompts: list[list[int]], tokens: int = 40) -> None:
    """Speculative (ngram) output equals plain greedy, with drafts accepted, and Hugging Face `generate`'s."""
    speculative, plain, accepted = speculative_and_plain(model, prompts, tokens)
    assert speculative == plain and accepted > 0
    assert plain == [hf_greedy(model, p, tokens) for p in prompts]
