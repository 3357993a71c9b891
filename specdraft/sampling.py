"""Sampling math shared by the verifier (p, the target) and drafters (q): the filtered distribution,
inverse-CDF draws, and random numbers keyed by (seed, position) instead of drawn from a stream.

Why keyed draws: a request's random numbers must not depend on what else runs in its batch, nor on
how long its drafts are. Each draw is a pure function of the request's seed, the absolute position of
the token it decides, and a stream id, so a seeded request gives the same tokens alone, in any batch,
and with rows joining or leaving (`tests/ground/test_seeded_sampling.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from specdraft.splitmix import GOLDEN, mix

if TYPE_CHECKING:
    from specdraft.params import SamplingParams

# Stream ids: which decision at a position a uniform belongs to.
SAMPLE = 0  # the target's own draw from p (also the bonus token), and the test of deterministic drafts
ACCEPT = 1  # the acceptance test u * q(d) < p(d) of a probabilistic draft
RESIDUAL = 2  # the recovered token's draw from norm(max(0, p - q))
DRAFT = 3  # a probabilistic drafter's draw from q
STREAMS = 4


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The index of each last-dimension maximum (the first of equal ones), as torch's `argmax`. On
    the host by NumPy's, which is vectorised (torch's CPU reduction over a vocabulary is not: 0.15 ms
    against 0.02 for a verify pass's 6 x 49152 logits)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)



def keyed_uniforms(seeds: np.ndarray, positions: np.ndarray, stream: int) -> np.ndarray:
    """U[0, 1) draws, one per (seed, position) pair (broadcast), as float64 with 53 random bits."""
    with np.errstate(over="ignore"):
        key = mix(np.asarray(seeds, dtype=np.uint64) * GOLDEN + np.uint64(0x632BE59BD9B4E019))
        counter = np.asarray(positions, dtype=np.uint64) * np.uint64(STREAMS) + np.uint64(stream)
        bits = mix(key ^ mix(counter + GOLDEN))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def request_seed(params: SamplingParams) -> int:
    """The key of a request's random draws: its seed, or one drawn for it where it gives none."""
    return params.seed if params.seed is not None else int(np.random.SeedSequence().entropy % 2**63)


def inverse_cdf(dist: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample index i with probability dist[..., i] / dist.sum(-1): the first i whose CDF exceeds u.

    dist: [..., vocab] non-negative, need not be normalised; u: [...] uniforms in [0, 1).
    A token of probability 0 is never returned (its CDF step is empty).
    """
    cdf = dist.cumsum(-1)  # [..., vocab]
    scaled = (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1).contiguous()  # [..., 1]
    index = torch.searchsorted(cdf.contiguous(), scaled, right=True).squeeze(-1)
    # u * total can round up to total itself (odds ~2^-24): then take the most likely token.
    return torch.where(index < dist.shape[-1], index, dist.argmax(-1))


def distribution(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """`logits_to_probs` for rows sampled with `params` (one per row, greedy rows at temperature 1):
    the per-row settings go to the device as inputs, and nothing is read back from it."""
    device = logits.device
    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    top_k = torch.tensor([p.top_k for p in params], device=device) if any(p.top_k for p in params) else None
    top_p = torch.tensor([p.top_p for p in params], device=device) if any(p.top_p < 1 for p in params) else None
    return logits_to_probs(logits, temperature, top_k, top_p, max_top_k=max(p.top_k for p in params) or None)


def logits_to_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                    top_p: torch.Tensor | None = None, max_top_k: int | None = None) -> torch.Tensor:
    """The sampling distribution, row by row, composed like Hugging Face `generate` and vLLM:
    temperature, then top-k, then top-p over what top-k kept, renormalised.

    logits: [batch, T, vocab]; temperature: [batch] (> 0); top_k, top_p: [batch] tensors (0 and 1.0
    disable them per row), or None when no row filters (decided on the host: no device sync here).
    Ties, as in transformers: top-k keeps every token tied with the k-th largest logit. top-p removes
    tokens from the least likely up while their cumulative probability is <= 1 - top_p and always
    keeps the most likely token; tokens tied exactly at that boundary are ordered by `torch.sort`, the
    same call transformers and vLLM make, so all three drop the same ones. The same function gives p
    (target) and q (drafter).
    max_top_k: the largest top_k on the host, if the caller knows it (else it is read from the device).
    Returns probabilities [batch, T, vocab], float32.
    """
    scaled = logits.float() / temperature[:, None, None]
    if top_k is not None:
        vocab = scaled.shape[-1]
        widest = min(int(top_k.max()) if max_top_k is None else max_top_k, vocab)  # rows with top_k 0 need none
        k = top_k.clamp(min=1, max=widest)  # [batch]
        kth = scaled.topk(widest, dim=-1).values.gather(-1, (k - 1)[:, None, None].expand(*scaled.shape[:2], 1))
        kth = torch.where((top_k > 0)[:, None, None], kth, float("-inf"))  # [batch, T, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None:
        ascending, order = scaled.sort(dim=-1)  # [batch, T, vocab]
        cumulative = ascending.softmax(-1).cumsum(-1)
        remove = cumulative <= (1.0 - top_p)[:, None, None]
        remove[..., -1] = False
        scaled = scaled.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return scaled.softmax(-1)
