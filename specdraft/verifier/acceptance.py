"""Acceptance rules: batched, on the device, free of host syncs. See `specdraft.verifier` for terms.

Every function takes padded drafts `draft [batch, k]` (pad -1) and returns `tokens [batch, k + 1]`
(the emitted tokens, pad -1) and `accepted [batch]` (accepted draft tokens per row); row b emits
`accepted[b] + 1` tokens. `greedy_accept_host` is `greedy_accept` on host arrays, for logits that are
already on the host (a CPU pass): the same tokens, in a fraction of the time.
"""

from __future__ import annotations

import numpy as np
import torch

from specdraft.sampling import ACCEPT, RESIDUAL, SAMPLE, argmax, inverse_cdf

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
    target = argmax(logits)  # [batch, k + 1]
    accepted = _accepted_prefix(target[:, :-1] == draft)  # padding (-1) never matches
    final = target.gather(1, accepted[:, None]).squeeze(1)
    return _emit(draft, accepted, final), accepted


def greedy_accept_host(logits: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`greedy_accept` on the host: logits [batch, k + 1, vocab] float32, draft [batch, k] int64 (pad
    -1). The same argmax (NumPy's, the first of equal maxima, as `sampling.argmax` takes on the host),
    the same prefix rule, in one NumPy reduction and a loop over a few small lists: on a CPU step,
    where the logits are on the host, cheaper than the torch rule's dozen operations and its transfer."""
    batch, k = draft.shape
    target = logits.argmax(axis=-1).tolist()  # [batch][k + 1]
    tokens, accepted = [], []
    for row, drafted in zip(target, draft.tolist()):
        n = 0
        while n < k and drafted[n] == row[n]:  # padding (-1) never matches
            n += 1
        tokens.append(drafted[:n] + [row[n]] + [PAD] * (k - n))
        accepted.append(n)
    return np.array(tokens, dtype=np.int64), np.array(accepted, dtype=np.int64)


def rejection_sample(
    p: torch.Tensor,
    draft: torch.Tensor,
    u: torch.Tensor,
    q: torch.Tensor | None = None,
    probabilistic: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), exact in distribution.

    p: [batch, k + 1, vocab] target distribution at [last token, d1..dk]; draft: [batch, k], pad -1.
    u: [batch, k + 1, 3] uniforms per position for the streams SAMPLE, ACCEPT, RESIDUAL
    (`specdraft.sampling`). q: [batch, k, vocab] the drafter's distribution for the rows where
    `probabilistic` [batch] is True; the other rows' drafts are deterministic (q one-hot).

    Every position t has the target's own draw y_t = inverse_cdf(p_t, u_t). A deterministic draft
    token d_t is accepted when y_t == d_t, an event of probability p_t(d_t) = min(1, p/q) for a
    one-hot q; at the first rejection y_t is the recovered token (distributed as p_t without d_t,
    i.e. norm(max(0, p_t - q_t))). So the row emits y_0, y_1, ... exactly as plain sampling with the
    same draws would, whatever was drafted. A probabilistic draft token is accepted when
    u * q(d) < p(d), and a rejection draws the recovered token from norm(max(0, p - q)). The bonus
    token after a fully accepted draft is y at that position.
    """
    batch, k = draft.shape
    y = inverse_cdf(p, u[..., SAMPLE])  # [batch, k + 1]
    valid = draft >= 0  # [batch, k]
    accept = y[:, :k] == draft
    if q is not None:
        safe_draft = draft.clamp(min=0)[:, :, None]  # [batch, k, 1]
        p_draft = p[:, :k].gather(2, safe_draft).squeeze(2)  # [batch, k]
        q_draft = q.gather(2, safe_draft).squeeze(2)
        tested = u[:, :k, ACCEPT].to(p.dtype) * q_draft < p_draft  # u < p/q without dividing by q = 0
        accept = torch.where(probabilistic[:, None], tested, accept)
    accepted = _accepted_prefix(accept & valid)
    final = y.gather(1, accepted[:, None]).squeeze(1)  # bonus, or a deterministic row's recovered token
    if q is not None and k:
        at = accepted.clamp(max=k - 1)  # [batch]
        index = at[:, None, None].expand(batch, 1, p.shape[-1])
        p_at, q_at = p.gather(1, index).squeeze(1), q.gather(1, index).squeeze(1)  # [batch, vocab]
        residual = (p_at - q_at).clamp(min=0.0)
        # A residual of all zeros means p == q there; rejection then has probability 0.
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)
        recovered = inverse_cdf(residual, u[:, :k, RESIDUAL].gather(1, at[:, None]).squeeze(1))
        rejected = probabilistic & (accepted < valid.sum(dim=1))
        final = torch.where(rejected, recovered, final)
    return _emit(draft, accepted, final), accepted
