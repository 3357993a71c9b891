"""Per-request drafter state for an engine that passes batch rows, not request ids (vLLM's custom
proposer hook). `RowTracker.step` works out which request each row holds, brings that request's
drafter state up to date with `accept`, and drafts; a request's tables are built once (`begin`) and
then only extended, never rebuilt from the whole context while the row is recognised.

Each step the engine passes, per row i: `sampled[i]`, the tokens that joined the row's context this
step (accepted draft plus the target's token; empty while a prompt is still being prefilled in
chunks), its context length n_i, and its context `token_ids[i, :n_i]`. Rows move between steps:
finished requests leave, later rows slide into the holes, new requests take free rows, rows may be
swapped, and a preempted request comes back in any row with its whole context to recompute.

Matching: a tracked request r, whose context c has length L, holds row i this step when
  1. L + len(sampled[i]) == n_i and token_ids[i, L:n_i] == sampled[i]: the row is c plus this step's
     tokens (on the row r held last step, L + len(sampled[i]) < n_i is also taken, as a step whose
     `propose` the engine skipped: the missing tokens are accepted from the row);
  2. sampled[i][:-1] is a prefix of r's last draft (only drafted tokens can be accepted);
  3. token_ids[i] equals c at the probes: the last TAIL positions of c, SPREAD positions spread
     evenly over c, and a window of WINDOW positions that moves along c by WINDOW every step.
Each row first tries the request it held last step; the rows that fail (the batch changed) look up
the unclaimed requests by (L, last TAIL tokens) and check them the same way. That costs
O(TAIL + SPREAD + WINDOW) per row and step, whatever the context length.

Mismatch: a row that no tracked request passes gets a new drafter request begun from
`token_ids[i, :n_i]` (a rebuild, O(n_i) once). Two contexts of equal length that agree on their
last TAIL tokens and at the SPREAD positions but differ elsewhere are told apart by the moving
window within ceil(L / WINDOW) steps, and then rebuilt; until then the row's drafts come from the
other context. A draft never changes the engine's output (it verifies every draft), only how much of
it is accepted.

Leaving: a request that no row claims is kept, absent, for `grace_steps` steps, so that a preempted
or unscheduled request that comes back is matched again without a rebuild; then it is `end`ed. At
most `capacity` absent requests are kept, the longest absent freed first. Requests still held when
the engine stops calling `step` are freed by `close`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numba import njit

from specdraft.drafters.base import Drafter
from specdraft.drafters.buffers import TokenBuffer
from specdraft.params import SamplingParams

TAIL = 8
SPREAD = 8
WINDOW = 32
_NO_TOKENS = np.empty(0, dtype=np.int32)


@njit(cache=True, nogil=True)
def holds(row, n, new, tokens, length, draft, cursor, same_row) -> bool:
    """Checks 1-3 of the module docstring: whether the request whose context is tokens[:length]
    (last draft `draft`, window at `cursor`) holds a row `row[:n]` to which `new` was just added.
    `same_row`: the request held this row last step (it may have missed a step)."""
    s = new.shape[0]
    if length + s != n and not (same_row and length + s < n):
        return False
    for j in range(s):
        if row[n - s + j] != new[j]:
            return False
    if length + s == n and s > 1:
        if s - 1 > draft.shape[0]:
            return False
        for j in range(s - 1):
            if new[j] != draft[j]:
                return False
    if length == 0:
        return True
    for j in range(TAIL + SPREAD + WINDOW):
        if j < TAIL:
            p = (length - TAIL + j) % length
        elif j < TAIL + SPREAD:
            p = ((j - TAIL) * length) // SPREAD
        else:
            p = (cursor + j - TAIL - SPREAD) % length
        if row[p] != tokens[p]:
            return False
    return True


class _Request:
    """One drafter request as the tracker knows it: its id and a copy of its context (for the probes)."""

    __slots__ = ("id", "context", "draft", "cursor", "absent_since")

    def __init__(self, request_id: str, context: np.ndarray) -> None:
        self.id = request_id
        self.context = TokenBuffer(context)
        self.draft = _NO_TOKENS  # the last draft proposed for it
        self.cursor = 0  # where the moving window starts; it moves on only when a row is claimed
        self.absent_since = -1  # the step since which no row holds it (-1: held)

    @property
    def length(self) -> int:
        return self.context.length

    def extend(self, new: np.ndarray) -> None:
        """Append the tokens that joined the context, and move the window on."""
        self.cursor = (self.cursor + WINDOW) % max(1, self.length)
        self.context.extend(new)

    def key(self) -> tuple[int, bytes]:
        return self.length, self.context.data[max(0, self.length - TAIL) : self.length].tobytes()


def _row_key(row: np.ndarray, length: int) -> tuple[int, bytes]:
    return length, row[max(0, length - TAIL) : length].tobytes()


@dataclass
class TrackerStats:
    """Counts since the tracker was built: `begun` drafter requests (new requests and rebuilds),
    `rematched` (requests found again in another row or after being absent), `ended` drafter requests."""

    begun: int = 0
    rematched: int = 0
    ended: int = 0


class RowTracker:
    """Drives one `Drafter` for an engine's batch rows.

    drafter: built for drafts of up to k tokens; max_model_len: no draft reaches past it;
    grace_steps, capacity: how long, and how many, absent requests are kept (see the module docstring).
    """

    def __init__(self, drafter: Drafter, k: int, max_model_len: int, grace_steps: int = 32,
                 capacity: int = 256) -> None:
        self.drafter, self.k, self.max_model_len = drafter, k, max_model_len
        self.grace_steps, self.capacity = grace_steps, capacity
        self.stats = TrackerStats()
        self._held: list[_Request | None] = []  # by row, as of the last step
        self._absent: dict[str, _Request] = {}  # insertion order: longest absent first
        self._step = 0
        self._ids = itertools.count()
        # Compile (or load from numba's cache) before the first step.
        holds(_NO_TOKENS, 0, _NO_TOKENS, _NO_TOKENS, 0, _NO_TOKENS, 0, True)

    @property
    def live(self) -> int:
        """Drafter requests not yet ended (held by a row or absent)."""
        return sum(r is not None for r in self._held) + len(self._absent)

    def step(self, sampled: Sequence[Sequence[int]], num_tokens: np.ndarray, token_ids: np.ndarray) -> list[list[int]]:
        """Row i's draft (possibly empty) for rows 0..len(sampled)-1; `num_tokens[i]` and
        `token_ids[i, :num_tokens[i]]` are row i's context length and context, `sampled[i]` the
        tokens that joined it this step."""
        self._step += 1
        batch = len(sampled)
        new_tokens = [np.asarray(s, dtype=np.int32).reshape(-1) for s in sampled]
        held: list[_Request | None] = [None] * batch
        claimed: set[str] = set()
        pending = []
        for i in range(batch):
            request = self._held[i] if i < len(self._held) else None
            if request is not None and self._follow(request, token_ids[i], int(num_tokens[i]), new_tokens[i], True):
                held[i] = request
                claimed.add(request.id)
            else:
                pending.append(i)
        if pending:
            self._match_moved(pending, held, claimed, new_tokens, num_tokens, token_ids)
        self._retire(claimed)
        self._held = held
        return self._draft(held, new_tokens, num_tokens)

    def close(self) -> None:
        """End every drafter request still tracked."""
        for request in [r for r in self._held if r is not None] + list(self._absent.values()):
            self._end(request)
        self._held, self._absent = [], {}

    # -- matching ---------------------------------------------------------------------------------
    def _follow(self, request: _Request, row: np.ndarray, n: int, new: np.ndarray, same_row: bool) -> bool:
        """Whether `request` holds this row (checks 1-3); if so, accept the tokens that joined it."""
        length = request.length
        if not holds(row, n, new, request.context.data, length, request.draft, request.cursor, same_row):
            return False
        joined = new if length + len(new) == n else np.array(row[length:n], dtype=np.int32)
        if len(joined):
            self.drafter.accept(request.id, joined)
        request.extend(joined)
        request.draft = _NO_TOKENS
        return True

    def _match_moved(self, pending: list[int], held: list[_Request | None], claimed: set[str],
                     new_tokens: list[np.ndarray], num_tokens: np.ndarray, token_ids: np.ndarray) -> None:
        """Rows whose last request did not follow: find their request among the unclaimed ones, or begin one."""
        unclaimed = [r for r in self._held if r is not None and r.id not in claimed] + list(self._absent.values())
        by_key: dict[tuple[int, bytes], list[_Request]] = {}
        for request in unclaimed:
            by_key.setdefault(request.key(), []).append(request)
        for i in pending:
            n, new = int(num_tokens[i]), new_tokens[i]
            row = token_ids[i]
            for request in by_key.get(_row_key(row, n - len(new)), ()):
                if request.id not in claimed and self._follow(request, row, n, new, False):
                    held[i] = request
                    claimed.add(request.id)
                    self._absent.pop(request.id, None)
                    self.stats.rematched += 1
                    break
            else:
                held[i] = self._begin(np.array(row[:n], dtype=np.int32))
                claimed.add(held[i].id)

    def _begin(self, context: np.ndarray) -> _Request:
        request = _Request(f"row-request-{next(self._ids)}", context)
        params = SamplingParams(max_tokens=max(1, self.max_model_len - len(context)))
        self.drafter.begin(request.id, context, params)
        self.stats.begun += 1
        return request

    def _retire(self, claimed: set[str]) -> None:
        """Requests held last step but claimed by no row become absent; end those absent too long."""
        for request in self._held:
            if request is not None and request.id not in claimed:
                request.absent_since = self._step
                self._absent[request.id] = request
        while self._absent:  # in the order they left: the longest absent first
            request = next(iter(self._absent.values()))
            if len(self._absent) <= self.capacity and self._step - request.absent_since < self.grace_steps:
                break
            del self._absent[request.id]
            self._end(request)

    def _end(self, request: _Request) -> None:
        self.drafter.end(request.id)
        self.stats.ended += 1

    # -- drafting ---------------------------------------------------------------------------------
    def _draft(self, held: list[_Request | None], new_tokens: list[np.ndarray], num_tokens: np.ndarray) -> list[list[int]]:
        """Draft for rows that sampled a token this step and have room left before max_model_len."""
        drafts: list[list[int]] = [[] for _ in held]
        rows, limits = [], []
        for i in range(len(held)):
            room = self.max_model_len - int(num_tokens[i])
            if len(new_tokens[i]) and room > 0:
                rows.append(i)
                limits.append(min(self.k, room))
        if not rows:
            return drafts
        proposed = self.drafter.propose([held[i].id for i in rows], limits)
        for i, draft in zip(rows, proposed):
            held[i].draft = draft.token_ids
            drafts[i] = draft.token_ids.tolist()
        return drafts
