"""A row's logits pass by pass: a prefill chunk, then passes of random tokens (committed), through a
`RowModel` on numba's compiled layers, for comparing two models' arithmetic pass for pass; the stock
model's logits of a context (`stock_logits`); greedy output through `LLM`, speculative and plain
(`speculative_and_plain`)."""

from __future__ import annotations

import numpy as np
import torch

from specdraft.backend import RowModel
from specdraft.backend.numba_layers import NumbaLayers
from tests.helpers.tiny import TINY_VOCAB, loaded


def pass_logits(model, prompt, counts):
    """The logits of `prompt` prefilled in one chunk, then of each pass of `counts` random tokens."""
    rows = RowModel(model, compiled=True)
    assert isinstance(rows.compiled_layers, NumbaLayers)
    rows.add("r", active=True)
    first = rows.prefill("r", prompt).clone()  # a prefill chunk: longer than the compiled passes
    return [first, *row_passes_after(rows, counts)]


def row_passes_after(rows, counts):
    """The logits of passes of `counts` random tokens each, committed, on a row already prefilled."""
    out, rng = [], np.random.default_rng(0)
    for n in counts:
        ids = rng.integers(0, TINY_VOCAB, size=(1, n))
        out.append(rows.forward(rows.active_window, ids).clone())
        rows.commit(rows.active_window, [n])
    return out


PROMPTS = [[33, 34, 35, 36] * 5, [5, 17, 42, 9, 9, 13], list(range(1, 30))]  # tiny-vocabulary prompts, one repetitive


def stock_logits(model, ids: list[int]) -> torch.Tensor:
    """The stock model's logits of `ids`: [T, vocab] float32."""
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def speculative_and_plain(model, prompts: list[list[int]], max_tokens: int) -> tuple[list, list, int]:
    """Greedy outputs through `LLM`: ngram (a fixed policy) and none; and the tokens ngram's drafts had accepted."""
    from specdraft import LLM, SamplingParams, SpeculationParams

    llm = LLM(loaded(model), drafters=["none", "ngram"], k=4, max_batch=4, calibrate=False)
    sampling = SamplingParams(max_tokens=max_tokens)
    speculative = llm.generate(prompts, sampling, SpeculationParams("ngram", policy="fixed"))
    plain = llm.generate(prompts, sampling, SpeculationParams("none"))
    return ([c.token_ids for c in speculative], [c.token_ids for c in plain],
            sum(c.metrics.accepted_tokens for c in speculative))
