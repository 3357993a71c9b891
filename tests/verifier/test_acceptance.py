"""Acceptance rules: table-driven greedy cases and the distribution-preservation proof by sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft.sampling import inverse_cdf
from specdraft.verifier.acceptance import PAD
from tests.helpers.acceptance import padded_greedy, padded_greedy_host, padded_rejection_sample

V = 8


def logits_for(targets: list[list[int]]) -> torch.Tensor:
    """Logits whose argmax at [b, t] is targets[b][t]."""
    out = torch.zeros(len(targets), len(targets[0]), V)
    for b, row in enumerate(targets):
        for t, token in enumerate(row):
            out[b, t, token] = 5.0
    return out


@pytest.mark.parametrize(
    "draft, target, expected_tokens, expected_accepted",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),  # perfect match -> k + 1 tokens (bonus)
        ([1, 2, 3], [5, 2, 3, 4], [5], 0),  # mismatch at position 0 -> the target's token
        ([1, 2, 3], [1, 6, 3, 4], [1, 6], 1),  # mismatch at position 1
        ([1, 2, 3], [1, 2, 7, 4], [1, 2, 7], 2),  # mismatch at the last position
        ([], [4], [4], 0),  # empty draft -> one token
        ([1, PAD, PAD], [1, 2, 0, 0], [1, 2], 1),  # padded (shorter) draft -> bonus after its end
    ],
)
def test_greedy_table(draft, target, expected_tokens, expected_accepted):
    tokens, accepted = padded_greedy(logits_for([target]), torch.tensor([draft], dtype=torch.long).reshape(1, -1))
    assert accepted.tolist() == [expected_accepted]
    row = tokens[0].tolist()
    assert row[: expected_accepted + 1] == expected_tokens
    assert all(t == PAD for t in row[expected_accepted + 1 :])


def test_greedy_on_the_host_is_the_same_rule():
    """`greedy_accept_host` (a CPU pass's logits, already on the host) against the torch rule: rows
    of random drafts (padded, partly right), ties in the logits (the first maximum wins), k = 0."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        batch, k = int(rng.integers(1, 5)), int(rng.integers(0, 6))
        logits = rng.integers(0, 4, (batch, k + 1, V)).astype(np.float32)  # small integers: many ties
        target = logits.argmax(-1)
        draft = np.where(rng.random((batch, k)) < 0.7, target[:, :k], rng.integers(0, V, (batch, k)))
        lengths = rng.integers(0, k + 1, batch)
        draft[np.arange(k)[None, :] >= lengths[:, None]] = PAD
        tokens, accepted = padded_greedy(torch.from_numpy(logits), torch.from_numpy(draft))
        host_tokens, host_accepted = padded_greedy_host(logits, draft)
        assert host_tokens.dtype == np.int64 and host_accepted.dtype == np.int64
        assert host_tokens.tolist() == tokens.tolist() and host_accepted.tolist() == accepted.tolist()


def test_greedy_rows_are_independent():
    draft = torch.tensor([[1, 2], [3, PAD], [PAD, PAD]])
    tokens, accepted = padded_greedy(logits_for([[1, 2, 5], [3, 4, 0], [6, 0, 0]]), draft)
    assert accepted.tolist() == [2, 1, 0]
    assert tokens.tolist() == [[1, 2, 5], [3, 4, PAD], [6, PAD, PAD]]


# -- sampling ------------------------------------------------------------------------------
N = 100_000
K = 3
P = torch.tensor(
    [
        [0.30, 0.25, 0.20, 0.10, 0.08, 0.04, 0.02, 0.01],
        [0.05, 0.40, 0.05, 0.30, 0.10, 0.05, 0.03, 0.02],
        [0.10, 0.10, 0.10, 0.10, 0.20, 0.20, 0.10, 0.10],
        [0.50, 0.10, 0.10, 0.10, 0.05, 0.05, 0.05, 0.05],  # bonus position
    ]
)
Q = torch.tensor(
    [
        [0.10, 0.40, 0.10, 0.20, 0.10, 0.05, 0.03, 0.02],
        [0.20, 0.20, 0.20, 0.10, 0.10, 0.10, 0.05, 0.05],
        [0.30, 0.05, 0.05, 0.30, 0.10, 0.10, 0.05, 0.05],
    ]
)


def tvd(samples: torch.Tensor, dist: torch.Tensor) -> float:
    empirical = torch.bincount(samples, minlength=dist.numel()).double() / samples.numel()
    return 0.5 * (empirical - dist.double()).abs().sum().item()


# For deterministic drafts: each position has a likely token (the one drafted), so later positions
# are reached often enough to measure.
P_DET = torch.tensor(
    [
        [0.05, 0.70, 0.05, 0.05, 0.05, 0.04, 0.03, 0.03],
        [0.02, 0.03, 0.05, 0.75, 0.05, 0.05, 0.03, 0.02],
        [0.05, 0.05, 0.05, 0.05, 0.05, 0.65, 0.05, 0.05],
        [0.30, 0.10, 0.10, 0.10, 0.20, 0.10, 0.05, 0.05],
    ]
)


def run_sampler(q_for_draft, q_given, draft_fixed, seed: int = 0, target: torch.Tensor = P):
    gen = torch.Generator().manual_seed(seed)
    p = target.expand(N, K + 1, V)
    if draft_fixed is None:
        draft = torch.stack([torch.multinomial(q_for_draft[i], N, replacement=True, generator=gen) for i in range(K)], 1)
    else:
        draft = torch.tensor(draft_fixed).expand(N, K)
    u = torch.rand(N, K + 1, 3, generator=gen)
    if q_given is None:
        return draft, padded_rejection_sample(p, draft, u)
    return draft, padded_rejection_sample(p, draft, u, q_given.expand(N, K, V), torch.ones(N, dtype=torch.bool))


def emitted_at(tokens: torch.Tensor, accepted: torch.Tensor, position: int) -> torch.Tensor:
    reached = accepted >= position  # rows whose output has a token at this position
    return tokens[reached, position]


@pytest.mark.parametrize("position", range(K + 1))
def test_probabilistic_drafts_preserve_target_distribution(position):
    _, (tokens, accepted) = run_sampler(Q, Q, None)
    samples = emitted_at(tokens, accepted, position)
    assert samples.numel() > 20_000
    assert tvd(samples, P[position]) < 0.01


def test_acceptance_rate_matches_theory():
    draft, (_, accepted) = run_sampler(Q, Q, None, seed=1)
    observed = (accepted >= 1).double().mean().item()
    assert abs(observed - torch.minimum(P[0], Q[0]).sum().item()) < 0.01


@pytest.mark.parametrize("position", range(K + 1))
def test_deterministic_drafts_preserve_target_distribution(position):
    # q one-hot: the drafter always proposes token 1, then 3, then 5 (probs=None path).
    _, (tokens, accepted) = run_sampler(None, None, [1, 3, 5], seed=2, target=P_DET)
    samples = emitted_at(tokens, accepted, position)
    assert samples.numel() > 20_000
    assert tvd(samples, P_DET[position]) < 0.01
    if position == 0:  # acceptance of a one-hot q is p(d)
        assert abs((accepted >= 1).double().mean().item() - P_DET[0, 1].item()) < 0.01


def test_negative_control_for_deterministic_drafts():
    draft, _ = run_sampler(None, None, [1, 3, 5], seed=2, target=P_DET)
    assert tvd(draft[:, 1], P_DET[1]) > 0.05


def test_negative_control_accepting_everything_fails_the_bound():
    draft, _ = run_sampler(Q, Q, None, seed=3)
    # "Accept every draft": the emitted token at position 0 is the draft token itself.
    assert tvd(draft[:, 0], P[0]) > 0.05


def test_token_with_zero_target_probability_is_never_emitted():
    p = P.clone()
    p[:, 6] = 0.0
    p = p / p.sum(-1, keepdim=True)
    gen = torch.Generator().manual_seed(4)
    draft = torch.full((N, K), 6)
    u = torch.rand(N, K + 1, 3, generator=gen)
    for q, probabilistic in ((None, None), (Q.expand(N, K, V), torch.ones(N, dtype=torch.bool))):
        tokens, accepted = padded_rejection_sample(p.expand(N, K + 1, V), draft, u, q, probabilistic)
        assert accepted.max().item() == 0
        assert not (tokens == 6).any()


def test_empty_draft_samples_from_p():
    gen = torch.Generator().manual_seed(5)
    u = torch.rand(N, 1, 3, generator=gen)
    tokens, accepted = padded_rejection_sample(P[:1].expand(N, 1, V), torch.empty(N, 0, dtype=torch.long), u)
    assert accepted.max().item() == 0
    assert tvd(tokens[:, 0], P[0]) < 0.01


def test_deterministic_rows_emit_the_targets_own_draws_whatever_was_drafted():
    """The coupled test: with the same uniforms, any deterministic draft yields the tokens that
    sampling each position from p with those uniforms yields (here p does not depend on the prefix)."""
    gen = torch.Generator().manual_seed(6)
    u = torch.rand(N, K + 1, 3, generator=gen)
    p = P_DET.expand(N, K + 1, V)
    plain = inverse_cdf(p, u[..., 0])  # [N, K + 1]
    for draft in ([1, 3, 5], [0, 0, 0], [1, PAD, PAD]):
        tokens, accepted = padded_rejection_sample(p, torch.tensor(draft).expand(N, K), u)
        emitted = accepted + 1
        for row in range(0, N, 997):
            assert tokens[row, : emitted[row]].tolist() == plain[row, : emitted[row]].tolist()


def test_mixed_rows_follow_their_own_rule():
    """One batch, probabilistic and deterministic rows: each row's output depends on its own inputs only."""
    gen = torch.Generator().manual_seed(7)
    u = torch.rand(N, K + 1, 3, generator=gen)
    draft = torch.stack([torch.multinomial(Q[i], N, replacement=True, generator=gen) for i in range(K)], 1)
    p, q = P.expand(N, K + 1, V), Q.expand(N, K, V)
    probabilistic = torch.arange(N) % 2 == 0
    mixed = padded_rejection_sample(p, draft, u, q, probabilistic)
    alone_q = padded_rejection_sample(p, draft, u, q, torch.ones(N, dtype=torch.bool))
    alone_det = padded_rejection_sample(p, draft, u)
    for ours, alone, rows in ((mixed, alone_q, probabilistic), (mixed, alone_det, ~probabilistic)):
        assert torch.equal(ours[0][rows], alone[0][rows]) and torch.equal(ours[1][rows], alone[1][rows])
