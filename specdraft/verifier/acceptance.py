"""Acceptance rules: batched, on the device, free of host syncs. See `specdraft.verifier` for terms.

Every function takes padded drafts `draft [batch, k]` (pad -1) and returns `tokens [batch, k + 1]`
(the emitted tokens, pad -1) and `accepted [batch]` (accepted draft tokens per row); row b emits
`accepted[b] + 1` tokens.
"""

from __future__ import annotations

import torch

PAD = -1


def _emit(draft: torch.Tensor, accepted: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """Accepted draft prefix, then `final` at index `accepted`, then padding."""
    batch, k = draft.shape
    positions = torch.arange(k + 1, device=draft.device)[None, :]  # [1, k + 1]
    padded = torch.cat([draft, torch.full((batch, 1), PAD, dtype=draft.dtype, device=draft.device)], 1)
    tokens = torch.where(positions < accepted[:, None], padded, PAD)
    return torch.where(positions == accepted[:, None], final[:, None], tokens)


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row. accept: [batch, k] bool."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def greedy_accept(logits: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest prefix where the target's argmax equals the draft.

    logits: [batch, k + 1, vocab] target logits at [last token, d1..dk]; draft: [batch, k].
    """
    target = logits.argmax(dim=-1)  # [batch, k + 1]
    accepted = _accepted_prefix(target[:, :-1] == draft)  # padding (-1) never matches
    final = target.gather(1, accepted[:, None]).squeeze(1)
    return _emit(draft, accepted, final), accepted


def rejection_sample(
    p: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), exact in distribution.

    p: [batch, k + 1, vocab] target distribution at [last token, d1..dk].
    draft: [batch, k] with pad -1; q: [batch, k, vocab] the drafter's distribution, or None for
    deterministic drafts (q one-hot at the drafted token).
    uniform: [batch, k] U(0, 1) draws; exponential: [batch, vocab] Exp(1) draws, used to sample the
    final token as argmax(dist / exponential) (an exponential race: exact sampling from dist).
    """
    batch, k = draft.shape
    valid = draft >= 0  # [batch, k]
    safe_draft = draft.clamp(min=0)[:, :, None]  # [batch, k, 1]
    p_draft = p[:, :k].gather(2, safe_draft).squeeze(2)  # [batch, k]
    if q is None:
        # q(d) = 1, so accept with probability p(d).
        accept = uniform < p_draft
        residual = p[:, :k].scatter(2, safe_draft, 0.0)  # max(0, p - onehot(d))
    else:
        q_draft = q.gather(2, safe_draft).squeeze(2)
        accept = uniform * q_draft < p_draft  # u < p/q without dividing by q = 0
        residual = (p[:, :k] - q).clamp(min=0.0)
    accepted = _accepted_prefix(accept & valid)

    # Final token: recovered from norm(residual) at the first rejection, or bonus from p after a full
    # acceptance (position `accepted` is then the first pad, or k).
    rejected = accepted < valid.sum(dim=1)  # [batch]
    at = accepted[:, None, None].expand(batch, 1, p.shape[-1])
    bonus = p.gather(1, at).squeeze(1)  # [batch, vocab]
    recovered = residual.gather(1, at.clamp(max=max(k - 1, 0))).squeeze(1) if k else bonus
    # A residual of all zeros means p == q there; rejection then has probability 0.
    recovered = torch.where(recovered.sum(-1, keepdim=True) > 0, recovered, bonus)
    dist = torch.where(rejected[:, None], recovered, bonus)  # unnormalised is fine for the race
    final = (dist / exponential).argmax(dim=-1)
    return _emit(draft, accepted, final), accepted
