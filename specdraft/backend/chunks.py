"""Where a prompt's prefill passes fall (`PrefillChunks`): at fixed positions from a row's start, so
that however a prompt is fed, and whatever a step's budget, its passes, and their arithmetic, are the
same. One `RowModel` owns one; a caller that budgets prefill reads the passes' sizes and costs here."""

from __future__ import annotations

import bisect
import math

from specdraft.backend.family import attention_knee, projection_work

MIN_CHUNK = 64  # the fewest tokens a prefill pass is cut to
# The most multiply-adds a prefill pass on CPU takes (SmolLM2-135M: 320 tokens, a quarter of a second on two
# Zen 4 cores; the 1.5B of the catalogue's pair: MIN_CHUNK): so a step with a long prompt in it stays short.
PASS_WORK = 2**35


class PrefillChunks:
    """The prefill pass boundaries of a model (config, the layers run) whose passes take at most
    prefill_chunk tokens; on_cpu: passes are also held to PASS_WORK multiply-adds.

    Passes are of about equal work rather than equal length (never under MIN_CHUNK tokens, a multiple
    of 16): on CPU the first takes at most PASS_WORK multiply-adds, up to `prefill_chunk` tokens; from
    boundary b, that times knee / (knee + b), knee being the cache entries at which a token's attention
    costs as much as its projections (`family.attention_knee`). So a pass deep in a long prompt, or of
    a large model, takes about as long as a small model's first, and a request waiting behind it no longer."""

    def __init__(self, config, num_layers: int, prefill_chunk: int, on_cpu: bool) -> None:
        self.prefill_chunk = prefill_chunk
        work, self._knee, self._least = projection_work(config), attention_knee(config), min(prefill_chunk, MIN_CHUNK)
        self._widest = prefill_chunk  # the first pass's tokens; none under `_least`, shrinking past the knee
        if work is not None and on_cpu and prefill_chunk * num_layers * work > PASS_WORK:
            self._widest = max(self._least, int(PASS_WORK / (num_layers * work)) // 16 * 16)
        self._boundaries = [0]  # where prefill passes begin, as far as asked

    def end(self, start: int, stop: int) -> int:
        """Where a prefill pass from position `start` ends, feeding at most up to `stop`: the next boundary."""
        return min(stop, self._boundaries[self._boundary_at(start) + 1])

    @property
    def widest(self) -> int:
        """The tokens of a prompt's first prefill pass, the longest."""
        return self._boundaries[self._boundary_at(0) + 1]

    def cost(self, start: int, end: int) -> int:
        """What a prefill pass of positions [start, end) counts in a step's token budget: its tokens
        scaled to a whole chunk's worth at its boundary (a full pass anywhere: `prefill_chunk`)."""
        i = self._boundary_at(start)
        return math.ceil((end - start) * self.prefill_chunk / (self._boundaries[i + 1] - self._boundaries[i]))

    def _boundary_at(self, position: int) -> int:
        """The index of the last pass boundary at or before `position` (boundaries computed as far as it)."""
        while self._boundaries[-1] <= position:
            last = self._boundaries[-1]
            shrunk = self._widest if math.isinf(self._knee) else int(
                self._widest * self._knee / (self._knee + last)) // 16 * 16
            self._boundaries.append(last + max(self._least, shrunk))
        return bisect.bisect_right(self._boundaries, position) - 1
