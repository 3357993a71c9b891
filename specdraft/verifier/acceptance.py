"""Acceptance rules: batched, on the device, free of host syncs. See `specdraft.verifier` for terms.

Every rule works in a pass's flat layout (`batch.Batch`): logits or p [N, vocab] at each row's last
token and draft tokens; following [N] the draft token each position tests (PAD at a row's last
position, which decides the bonus token); row_of [N] each position's row; starts [rows] where each
row begins. Each returns `tokens [N]`, in the same layout (row r emits tokens[starts[r] : starts[r] +
accepted[r] + 1]: its accepted draft, then the recovered or bonus token; what lies past that is not
read), and `accepted [rows]`. `greedy_accept_host` is `greedy_accept` on host arrays, for logits that
are already on the host (a CPU pass): the same tokens, in a fraction of the time.
"""

from __future__ import annotations

import numpy as np
import torch

from specdraft.sampling import ACCEPT, RESIDUAL, SAMPLE, argmax, inverse_cdf
from specdraft.verifier.batch import PAD

__all__ = ["PAD", "greedy_accept", "greedy_accept_host", "rejection_sample"]


def _accepted(accept: torch.Tensor, row_of: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Each row's leading run of accepted positions. accept: [N] bool, False at every row's last
    position (it tests no draft token), so each row's run ends inside the row."""
    flat = torch.arange(len(accept), device=accept.device)
    rejected_at = torch.where(accept, len(accept), flat)  # [N]
    first = torch.full_like(starts, len(accept)).scatter_reduce_(0, row_of, rejected_at, "amin")
    return first - starts  # [rows]


def greedy_accept(logits: torch.Tensor, following: torch.Tensor, row_of: torch.Tensor,
                  starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest prefix of each row's draft where the target's argmax equals it; the argmax
    at the first position that differs is the recovered (or bonus) token. Every emitted token is
    then the target's argmax where it sits."""
    target = argmax(logits)  # [N]
    return target, _accepted(target == following, row_of, starts)  # PAD never matches


def greedy_accept_host(logits: np.ndarray, following: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`greedy_accept` on the host: logits [N, vocab] float32, following [N] int64, offsets [rows + 1].
    The same argmax (NumPy's, the first of equal maxima, as `sampling.argmax` takes on the host), the
    same prefix rule, in one NumPy reduction and a loop over a few small lists: on a CPU step, where
    the logits are on the host, cheaper than the torch rule's operations and its transfer."""
    target = logits.argmax(axis=-1)  # [N]
    matches = (target == following).tolist()
    accepted = []
    for start in offsets[:-1].tolist():
        n = 0
        while matches[start + n]:  # a row's last position never matches: the run ends inside the row
            n += 1
        accepted.append(n)
    return target, np.array(accepted, dtype=np.int64)


def rejection_sample(p: torch.Tensor, following: torch.Tensor, u: torch.Tensor, row_of: torch.Tensor,
                     starts: torch.Tensor, q: torch.Tensor | None = None,
                     probabilistic: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), exact in distribution.

    p: [N, vocab] the target's distribution at each position; u: [N, 3] uniforms per position for the
    streams SAMPLE, ACCEPT, RESIDUAL (`specdraft.sampling`). q: [N, vocab] the drafter's distribution
    of the token each position tests, for the positions where `probabilistic` [N] is True (zeros at a
    row's last position); the other rows' drafts are deterministic (q one-hot).

    Every position t has the target's own draw y_t = inverse_cdf(p_t, u_t). A deterministic draft
    token d_t is accepted when y_t == d_t, an event of probability p_t(d_t) = min(1, p/q) for a
    one-hot q; at the first rejection y_t is the recovered token (distributed as p_t without d_t,
    i.e. norm(max(0, p_t - q_t))). So the row emits y_0, y_1, ... exactly as plain sampling with the
    same draws would, whatever was drafted. A probabilistic draft token is accepted when
    u * q(d) < p(d), and a rejection draws the recovered token from norm(max(0, p - q)). The bonus
    token after a fully accepted draft is y at that position.
    """
    y = inverse_cdf(p, u[:, SAMPLE])  # [N]
    tests = following >= 0  # [N]: positions that test a draft token
    accept = y == following
    if q is not None:
        safe = following.clamp(min=0)[:, None]  # [N, 1]
        p_draft, q_draft = p.gather(1, safe).squeeze(1), q.gather(1, safe).squeeze(1)  # [N]
        tested = u[:, ACCEPT].to(p.dtype) * q_draft < p_draft  # u < p/q without dividing by q = 0
        accept = torch.where(probabilistic, tested, accept)
    accepted = _accepted(accept & tests, row_of, starts)
    at = starts + accepted  # [rows]: the position deciding each row's last token
    final = y[at]  # bonus, or a deterministic row's recovered token
    if q is not None:
        p_at, q_at = p[at], q[at]  # [rows, vocab]
        residual = (p_at - q_at).clamp(min=0.0)
        # A residual of all zeros means p == q there; rejection then has probability 0.
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)
        recovered = inverse_cdf(residual, u[at, RESIDUAL])
        final = torch.where(probabilistic[at] & tests[at], recovered, final)
    flat = torch.arange(len(following), device=following.device)
    return torch.where(flat < at[row_of], following, final[row_of]), accepted
