"""Measured step costs: a verify pass T(B, N) over B rows computing N tokens, a costly drafter's pass
per drafted position D_d, its catch-up per token C_d, a measured drafter's call, and the step's other
host work O. Nothing here is assumed: every figure is a timing of this machine (`specdraft.policy`)."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

WINDOW = 7  # timings kept per cost: the estimate is their median
EMA = 0.2  # weight of a new timing of the other host work in its moving average


class _Timings:
    """The last WINDOW timings of one cost and their median (one slow step does not stick)."""

    def __init__(self, seconds: float) -> None:
        self.recent: deque[float] = deque([seconds], maxlen=WINDOW)
        self.seconds = seconds

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.seconds = statistics.median(self.recent)  # NumPy's value; a tenth of its time on a few floats


@dataclass
class CostModel:
    """Measured step costs: verify T(B, N) (B rows, N tokens computed), drafting D_d(n) per drafter,
    other host work O."""

    verify: dict[tuple[int, int], _Timings] = field(default_factory=dict)
    drafting: dict[str, _Timings] = field(default_factory=dict)  # source -> seconds per drafted token
    calls: dict[str, _Timings] = field(default_factory=dict)  # measured drafter -> seconds per call
    catch_up: dict[str, _Timings] = field(default_factory=dict)  # source -> seconds per caught-up token
    other: float = 0.0
    _fit: tuple[float, float, float] | None = None
    _stale: bool = True

    def observe_verify(self, batch: int, tokens: int, seconds: float) -> None:
        cell = self.verify.get((batch, tokens))
        if cell is None:
            self.verify[(batch, tokens)] = _Timings(seconds)
        else:
            cell.add(seconds)
        self._stale = True

    def observe_draft(self, drafter: str, tokens: int, seconds: float) -> None:
        self._per_token(self.drafting, drafter, tokens, seconds)

    def observe_catch_up(self, drafter: str, tokens: int, seconds: float) -> None:
        self._per_token(self.catch_up, drafter, tokens, seconds)

    def observe_call(self, drafter: str, seconds: float) -> None:
        self._per_token(self.calls, drafter, 1, seconds)

    def observe_other(self, seconds: float) -> None:
        self.other += EMA * (seconds - self.other)

    @staticmethod
    def _per_token(costs: dict[str, _Timings], drafter: str, tokens: int, seconds: float) -> None:
        if tokens > 0:
            timings = costs.get(drafter)
            if timings is None:
                costs[drafter] = _Timings(seconds / tokens)
            else:
                timings.add(seconds / tokens)

    def verify_seconds(self, batch: int, tokens: int) -> float:
        """A verify pass over `batch` rows computing `tokens` tokens."""
        if self._stale:
            self._refit()
        fitted = None
        if self._fit is not None:
            a, b, c = self._fit
            fitted = max(a + b * batch + c * tokens, 1e-9)
        cell = self.verify.get((batch, tokens))
        if cell is None:
            between = self._between(batch, tokens)
            return between if between is not None else (0.0 if fitted is None else fitted)
        if fitted is None or len(self.verify) < 4:
            return cell.seconds
        seen = len(cell.recent)  # one timing weighs as much as the fit; a full window nearly alone
        return (seen * cell.seconds + fitted) / (seen + 1)

    def _between(self, batch: int, tokens: int) -> float | None:
        """Linear between the nearest measured passes of this batch size below and above `tokens`
        (None where there are not both): the global fit is a line, and a pass's cost is not (a
        compiled step runs passes up to some length, longer ones run slower layers), so between two
        measurements the measurements are the better guide."""
        below = max((n for b, n in self.verify if b == batch and n < tokens), default=None)
        above = min((n for b, n in self.verify if b == batch and n > tokens), default=None)
        if below is None or above is None:
            return None
        low, high = self.verify[(batch, below)].seconds, self.verify[(batch, above)].seconds
        return low + (high - low) * (tokens - below) / (above - below)

    def draft_seconds(self, drafter: str, tokens: int) -> float:
        timings = self.drafting.get(drafter)
        return 0.0 if timings is None else timings.seconds * tokens

    def call_seconds(self, drafter: str) -> float | None:
        timings = self.calls.get(drafter)
        return None if timings is None else timings.seconds

    def catch_up_seconds(self, drafter: str, tokens: int) -> float:
        timings = self.catch_up.get(drafter)
        return 0.0 if timings is None else timings.seconds * tokens

    def _refit(self) -> None:
        self._stale = False
        cells = [(batch, tokens, timings.seconds) for (batch, tokens), timings in self.verify.items()]
        if len(cells) < 2:
            self._fit = None if not cells else (cells[0][2], 0.0, 0.0)
            return
        self._fit = least_squares(cells)


def least_squares(cells: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """The minimum-norm least-squares (a, b, c) of seconds ~ a + b * batch + c * tokens over cells
    (batch, tokens, seconds) with distinct (batch, tokens): `np.linalg.lstsq`'s answer. Where every
    cell has one batch size B (one request's steps), the constant and batch columns are one, the fit
    is a line in tokens (intercept i, slope c), and the least-norm split of i is a = i / (1 + B^2),
    b = i * B / (1 + B^2): computed so here, since the policy refits every step that drafts and a
    general solver's call is costly beside that; `lstsq` takes the other cases."""
    batches = {batch for batch, _, _ in cells}
    if len(batches) > 1:
        design = np.array([[1.0, batch, tokens] for batch, tokens, _ in cells])
        a, b, c = np.linalg.lstsq(design, np.array([seconds for *_, seconds in cells]), rcond=None)[0]
        return float(a), float(b), float(c)
    (batch,) = batches
    mean_tokens = sum(tokens for _, tokens, _ in cells) / len(cells)
    mean_seconds = sum(seconds for *_, seconds in cells) / len(cells)
    spread = sum((tokens - mean_tokens) ** 2 for _, tokens, _ in cells)  # > 0: one batch, distinct token counts
    slope = sum((tokens - mean_tokens) * (seconds - mean_seconds) for _, tokens, seconds in cells) / spread
    intercept = mean_seconds - slope * mean_tokens
    return intercept / (1 + batch * batch), intercept * batch / (1 + batch * batch), slope
