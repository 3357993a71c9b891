"""Per-request sampling parameters, validated once at the edge and shared by drafters and verifier."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens and when it stops.

    temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 disable those filters.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be between 0 and 100, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits, temperature, top_k=None, top_p=None):
    """Turn logits into the sampling distribution, row by row.

    logits: [batch, T, vocab]; temperature: [batch] tensor (> 0 here); top_k, top_p: [batch]
    tensors, or None when no row filters (decided on the host, so no device sync here).
    Returns probabilities [batch, T, vocab]. The same function gives p (target) and q (drafter),
    so both see identical filtering.
    """
    import torch

    scaled = logits.float() / temperature[:, None, None]
    if top_k is not None or top_p is not None:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        vocab = scaled.shape[-1]
        ranks = torch.arange(vocab, device=scaled.device)
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if top_k is not None:
            drop |= ranks >= torch.where(top_k > 0, top_k, vocab)[:, None, None]
        if top_p is not None:
            sorted_probs = sorted_logits.softmax(-1)
            # Drop a token once the tokens ranked above it reach top_p (the top token always stays).
            drop |= (sorted_probs.cumsum(-1) - sorted_probs) >= top_p[:, None, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
    return scaled.softmax(-1)
