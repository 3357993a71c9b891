"""How long replies run, so that a costly drafter's catch-up is priced against the tokens it is likely
to serve rather than the request's limit: a chat request without `max_tokens` may generate up to the
whole context, and most replies end far sooner.

Each finished reply is kept as its length and whether it ended by itself (a stop token or string) or
was cut (its limit, a cancellation, an error): a cut reply says only that replies run at least that
long. From the last WINDOW replies, the product-limit (Kaplan-Meier) estimate of S(t) = P(a reply runs
past t tokens) gives a running row that has generated g tokens its expected further tokens, at most
its room:

    served(g, room) = sum over t = g .. g + room - 1 of S(t) / S(g)

(the first term is 1: a running row emits at least one more token). Past the longest reply kept, S
stays at its last value. Where there is no evidence (fewer than MIN_REPLIES replies kept, or none that
ran past g tokens), the row is taken to run to its limit: served = room.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 256  # finished replies kept (the newest)
MIN_REPLIES = 4  # replies kept before their lengths are trusted


class ReplyLengths:
    def __init__(self) -> None:
        self._replies: deque[tuple[int, bool]] = deque(maxlen=WINDOW)  # (tokens generated, ended by itself)
        self._survival: np.ndarray | None = None  # S(0 .. longest kept), computed when first asked

    def record(self, length: int, ended: bool) -> None:
        """A finished reply: `length` tokens generated; `ended`: by itself (not cut at a limit)."""
        self._replies.append((max(0, int(length)), bool(ended)))
        self._survival = None

    def survival(self) -> np.ndarray:
        """S(t) = P(a reply runs past t tokens) for t = 0 .. the longest reply kept (product-limit)."""
        if self._survival is None:
            lengths = np.array([n for n, _ in self._replies], dtype=np.int64)
            ended = np.array([e for _, e in self._replies], dtype=bool)
            longest = int(lengths.max(initial=0))
            at_risk = len(lengths) - np.concatenate([[0], np.cumsum(np.bincount(lengths, minlength=longest + 1))[:-1]])
            ends = np.bincount(lengths[ended], minlength=longest + 1)  # replies that ended at exactly t tokens
            # A reply of t tokens ended is one that did not run past t: S(t) = prod over u <= t of (1 - d_u / n_u).
            self._survival = np.cumprod(1.0 - ends / np.maximum(at_risk, 1))
        return self._survival

    def served(self, generated: int, room: int) -> float:
        """Expected further tokens of a running row that has generated `generated` and may generate `room`."""
        if room <= 1 or len(self._replies) < MIN_REPLIES:
            return float(max(room, 0))
        curve = self.survival()
        if generated >= len(curve) or curve[generated] <= 0.0:
            return float(room)  # no reply kept ran this far: no evidence
        end = generated + room  # exclusive
        inside = curve[generated:min(end, len(curve))].sum()
        beyond = max(0, end - len(curve)) * curve[-1]
        return float((inside + beyond) / curve[generated])
