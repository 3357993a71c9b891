"""The verify pass's one layout (`specdraft.verifier.batch`): rows flat, by counts and offsets."""

from __future__ import annotations

import numpy as np
import torch

from specdraft.draft import Draft
from specdraft.verifier.batch import PAD, Batch, Verdict


def test_rows_lie_flat_in_order_each_its_last_token_then_its_draft():
    probs = torch.full((2, 5), 0.2)
    drafts = [Draft(np.array([7, 8], dtype=np.int32), probs), None, Draft(np.array([], dtype=np.int32)),
              Draft(np.array([4], dtype=np.int32))]
    batch = Batch.of(["a", "b", "c", "d"], [1, 2, 3, 9], drafts)
    assert batch.tokens.tolist() == [1, 7, 8, 2, 3, 9, 4] and batch.tokens.dtype == np.int64
    assert batch.counts.tolist() == [2, 0, 0, 1] and batch.offsets.tolist() == [0, 3, 4, 5, 7]
    assert batch.row_of.tolist() == [0, 0, 0, 1, 2, 3, 3]
    # Each position tests its row's next token; a row's last position tests none (it decides the bonus).
    assert batch.following.tolist() == [7, 8, PAD, PAD, PAD, 4, PAD]
    assert [batch.draft(r).tolist() for r in range(4)] == [[7, 8], [], [], [4]]
    assert batch.probs[0] is probs and batch.probs[1:] == (None, None, None)


def test_a_verdict_reads_each_rows_tokens_at_its_offset():
    tokens = np.array([7, 5, 0, 6, 11, 4, 12])
    verdict = Verdict(tokens, np.array([1, 0, 0, 1]), np.array([0, 3, 4, 5, 7]), (None, None, "the grammar failed", None),
                      np.zeros(4), (None,) * 4)
    assert [verdict.emitted(r) for r in range(4)] == [[7, 5], [6], [], [4, 12]]
    failed = Verdict.failed(["x", "y"], [0.5, 0.25])
    assert len(failed) == 2 and failed.emitted(1) == [] and failed.grammar_seconds.tolist() == [0.5, 0.25]
