"""How far could copying go? The tokens per target step of an oracle copy drafter on a known output.

At every step the oracle drafts the continuation, after any earlier occurrence of the context's last
token, that agrees longest with the tokens the target will produce (it knows them), up to k tokens;
the target accepts all of it and adds its own token. Its sources are the context (prompt and output
so far, never past the current end, as prompt lookup copies) and, optionally, a corpus of other
sequences (earlier requests' outputs: what a cross-request memory could hold). No drafter that
copies after a match of at least one token can accept more, so the figure bounds what `ngram`
(whose copies start after such a match) can reach on that output, at any draft length policy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

UNBOUNDED = 1 << 30


@njit(cache=True, nogil=True)
def _agreeing(source: np.ndarray, end: int, last: int, tokens: np.ndarray, pos: int, limit: int, best: int) -> int:
    """Longest run source[j + 1 : j + 1 + L] == tokens[pos : pos + L] over j with source[j] == last and
    j + 1 + L <= end, if longer than `best` (at most `limit`)."""
    for j in range(end - 1):
        if source[j] != last:
            continue
        n = 0
        while n < limit and j + 1 + n < end and source[j + 1 + n] == tokens[pos + n]:
            n += 1
        if n > best:
            best = n
            if best == limit:
                break
    return best


@njit(cache=True, nogil=True)
def _oracle_steps(tokens: np.ndarray, start: int, corpus: np.ndarray, k: int) -> int:
    """Target steps to produce tokens[start:] (the first from prefill, without a draft)."""
    steps, pos = 1, start + 1
    while pos < tokens.shape[0]:
        limit = min(k, tokens.shape[0] - pos)
        best = _agreeing(tokens, pos, tokens[pos - 1], tokens, pos, limit, 0)
        if best < limit and corpus.shape[0] > 0:
            best = _agreeing(corpus, corpus.shape[0], tokens[pos - 1], tokens, pos, limit, best)
        pos += best + 1
        steps += 1
    return steps


def copy_ceiling(prompt: Sequence[int], output: Sequence[int], k: int = UNBOUNDED,
                 corpus: Sequence[Sequence[int]] = ()) -> float:
    """Tokens per target step of the oracle copy drafter (drafts of at most k) producing `output`
    after `prompt`, copying from the context and from the sequences in `corpus`."""
    if not output:
        return 0.0
    tokens = np.asarray([*prompt, *output], dtype=np.int32)
    joined = np.asarray([t for seq in corpus for t in (*seq, -1)], dtype=np.int32)  # -1 matches nothing
    return len(output) / _oracle_steps(tokens, len(prompt), joined, k)
