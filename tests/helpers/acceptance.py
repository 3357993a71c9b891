"""The acceptance rules (`specdraft.verifier.acceptance`, which work in a pass's flat layout) called
on padded rows, as tables of cases read most plainly: draft [batch, k] (PAD after a row's draft),
p or logits [batch, k + 1, vocab], u [batch, k + 1, 3], q [batch, k, vocab], probabilistic [batch].
Each returns tokens [batch, k + 1] (PAD past the row's emitted tokens) and accepted [batch]."""

from __future__ import annotations

import numpy as np
import torch

from specdraft.verifier.acceptance import PAD, greedy_accept, greedy_accept_host, rejection_sample


def _layout(draft: torch.Tensor):
    """The flat layout of padded drafts: the mask of fed positions [batch, k + 1], following [N],
    row_of [N], starts [batch]."""
    batch, k = draft.shape
    feeds = (draft >= 0).sum(dim=1) + 1  # [batch]
    fed = torch.arange(k + 1)[None, :] < feeds[:, None]  # [batch, k + 1]
    following = torch.cat([draft, torch.full((batch, 1), PAD, dtype=draft.dtype)], 1)[fed]
    row_of = torch.arange(batch)[:, None].expand(batch, k + 1)[fed]
    return fed, following, row_of, torch.cumsum(feeds, 0) - feeds


def _padded(tokens: torch.Tensor, accepted: torch.Tensor, fed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full(fed.shape, PAD, dtype=torch.int64)
    out[fed] = tokens.to(torch.int64)
    out[torch.arange(fed.shape[1])[None, :] > accepted[:, None]] = PAD
    return out, accepted


def padded_greedy(logits: torch.Tensor, draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fed, following, row_of, starts = _layout(draft)
    return _padded(*greedy_accept(logits[fed], following, row_of, starts), fed)


def padded_greedy_host(logits: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    fed, following, _, starts = _layout(torch.from_numpy(draft))
    offsets = np.append(starts.numpy(), int(fed.sum()))
    tokens, accepted = greedy_accept_host(logits[fed.numpy()], following.numpy(), offsets)
    assert tokens.dtype == np.int64 and accepted.dtype == np.int64
    out, accepted = _padded(torch.from_numpy(tokens), torch.from_numpy(accepted), fed)
    return out.numpy(), accepted.numpy()


def padded_rejection_sample(p: torch.Tensor, draft: torch.Tensor, u: torch.Tensor, q: torch.Tensor | None = None,
                            probabilistic: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    fed, following, row_of, starts = _layout(draft)
    flat_q = flat_probabilistic = None
    if q is not None:
        flat_q = torch.cat([q, q.new_zeros(q.shape[0], 1, q.shape[2])], 1)[fed]
        flat_probabilistic = probabilistic[row_of]
    tokens, accepted = rejection_sample(p[fed], following, u[fed], row_of, starts, flat_q, flat_probabilistic)
    return _padded(tokens, accepted, fed)
