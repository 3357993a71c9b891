"""Sampling math: the filtered distribution equals Hugging Face's logits processors (top-k, top-p,
both, ties), inverse-CDF draws are exact, and keyed uniforms are uniform, independent and pure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdraft.sampling import keyed_uniforms, inverse_cdf, logits_to_probs


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """What `generate` samples from: its warpers in its order (temperature, top-k, top-p), then softmax."""
    scores = logits.clone()
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


def ours(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    batch = logits.shape[0]
    return logits_to_probs(
        logits[:, None, :], torch.full((batch,), temperature),
        torch.full((batch,), top_k) if top_k else None, torch.full((batch,), top_p) if top_p < 1 else None,
    )[:, 0]


LOG = lambda values: torch.tensor([[math.log(v) for v in values]])  # noqa: E731

CASES = {
    # name: (logits [1, V], temperature, top_k, top_p, expected probabilities or None)
    "issue example: top-p applies to what top-k kept": (LOG([0.4, 0.3, 0.2, 0.1]), 1.0, 2, 0.5, [1, 0, 0, 0]),
    "top-k only": (LOG([0.4, 0.3, 0.2, 0.1]), 1.0, 2, 1.0, [0.4 / 0.7, 0.3 / 0.7, 0, 0]),
    "top-p only": (LOG([0.4, 0.3, 0.2, 0.1]), 1.0, 0, 0.6, [0.4 / 0.7, 0.3 / 0.7, 0, 0]),
    "top-p keeps the top token at tiny p": (LOG([0.4, 0.3, 0.2, 0.1]), 1.0, 0, 0.01, [1, 0, 0, 0]),
    "top-k larger than the vocabulary": (LOG([0.4, 0.3, 0.2, 0.1]), 1.0, 10, 1.0, [0.4, 0.3, 0.2, 0.1]),
    "ties at the k-th value are all kept": (torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]]), 1.0, 2, 1.0, None),
    "tie at the top": (torch.tensor([[2.0, 2.0, 1.0, 0.5]]), 1.0, 1, 1.0, None),
    "ties with top-k and top-p": (torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, -1.0]]), 1.0, 3, 0.9, None),
    "temperature then both": (torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]]), 0.7, 4, 0.8, None),
    "all equal, top-p": (torch.zeros(1, 8), 1.0, 0, 0.5, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_filters_match_hugging_face(name):
    logits, temperature, top_k, top_p, expected = CASES[name]
    theirs = hf_probs(logits, temperature, top_k, top_p)
    mine = ours(logits, temperature, top_k, top_p)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    if expected is not None:
        torch.testing.assert_close(mine, torch.tensor([expected], dtype=torch.float32), rtol=0, atol=1e-6)


def test_ties_at_the_kth_value_are_kept():
    probs = ours(torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]]), 1.0, 2, 1.0)
    assert (probs[0, :4] > 0).all() and probs[0, 4] == 0  # 4 tokens kept for top_k = 2


@pytest.mark.parametrize("seed", range(20))
def test_random_rows_match_hugging_face(seed):
    """Random logits with bf16-like ties (rounded), random settings per row, many rows in one batch."""
    gen = torch.Generator().manual_seed(seed)
    batch, vocab = 16, 64
    logits = (torch.randn(batch, vocab, generator=gen) * 3).round()  # coarse values: ties are common
    settings = [(float(torch.rand(1, generator=gen) * 1.5 + 0.3), int(torch.randint(0, 12, (1,), generator=gen)),
                 float(torch.rand(1, generator=gen) * 0.9 + 0.1) if seed % 3 else 1.0) for _ in range(batch)]
    mine = logits_to_probs(
        logits[:, None], torch.tensor([t for t, _, _ in settings]), torch.tensor([k for _, k, _ in settings]),
        torch.tensor([p for _, _, p in settings]),
    )[:, 0]
    for b, (temperature, top_k, top_p) in enumerate(settings):
        torch.testing.assert_close(mine[b : b + 1], hf_probs(logits[b : b + 1], temperature, top_k, top_p), rtol=0, atol=1e-6)


def test_inverse_cdf_is_exact_and_skips_zero_probability():
    dist = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.999999])
    assert inverse_cdf(dist.expand(6, 6), u).tolist() == [1, 1, 3, 3, 4, 4]
    # Unnormalised weights work the same.
    assert inverse_cdf(4 * dist.expand(6, 6), u).tolist() == [1, 1, 3, 3, 4, 4]


def test_inverse_cdf_distribution():
    p = torch.tensor([0.05, 0.4, 0.0, 0.3, 0.25])
    u = torch.as_tensor(keyed_uniforms(np.uint64(3), np.arange(200_000), 0), dtype=torch.float32)
    counts = torch.bincount(inverse_cdf(p.expand(len(u), 5), u), minlength=5).double() / len(u)
    assert counts[2] == 0
    assert 0.5 * (counts - p.double()).abs().sum() < 0.005


def test_keyed_uniforms_are_pure_uniform_and_independent():
    positions = np.arange(100_000)
    a = keyed_uniforms(np.uint64(7), positions, 0)
    assert np.array_equal(a, keyed_uniforms(np.uint64(7), positions, 0))  # a pure function
    assert np.array_equal(a[500:600], keyed_uniforms(np.uint64(7), positions[500:600], 0))  # any subset, any order
    assert ((0 <= a) & (a < 1)).all()
    # Kolmogorov-Smirnov against U(0, 1): the 99.9% critical value at n = 100k is 1.95 / sqrt(n).
    for other in (a, keyed_uniforms(np.uint64(8), positions, 0), keyed_uniforms(np.uint64(7), positions, 1)):
        ks = np.abs(np.sort(other) - (np.arange(1, len(other) + 1) / len(other))).max()
        assert ks < 1.95 / math.sqrt(len(other))
    # Different seeds, streams and neighbouring positions are uncorrelated.
    for other in (keyed_uniforms(np.uint64(8), positions, 0), keyed_uniforms(np.uint64(7), positions, 1), np.roll(a, 1)):
        assert abs(np.corrcoef(a, other)[0, 1]) < 0.015
    # Broadcasting: seeds [batch, 1] x positions [1, T].
    grid = keyed_uniforms(np.array([[7], [8]], dtype=np.uint64), positions[None, :10], 0)
    assert np.array_equal(grid[0], a[:10])
