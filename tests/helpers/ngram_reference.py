"""Naive pure-Python references for the `ngram` drafter (`specdraft.drafters.ngram`): the longest
earlier match of a suffix, a context's most frequent follower, the cross-request memory's learn and
decay rules, and the whole drafter's rules written plainly; and what its property tests share (how
many examples, the small vocabularies over which n-grams repeat)."""

from __future__ import annotations

from hypothesis import strategies as st

EXAMPLES = 120
vocab_sizes = st.integers(2, 6)


def ref_longest_match(ctx: list[int], min_n: int, max_n: int) -> tuple[int, int]:
    """(start of the continuation, n) of the longest, most recent earlier occurrence of a suffix."""
    length = len(ctx)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        for start in range(length - n - 1, -1, -1):
            if ctx[start : start + n] == ctx[length - n :]:
                return start + n, n
    return -1, 0


def ref_follower(ctx: list[int], context: list[int]) -> tuple[int, int, int] | None:
    """(most frequent follower, ties to the most recent; its count; all followers) of `context` in ctx."""
    n, counts, last = len(context), {}, {}
    for start in range(len(ctx) - n):
        if ctx[start : start + n] == context:
            token = ctx[start + n]
            counts[token] = counts.get(token, 0) + 1
            last[token] = start
    if not counts:
        return None
    best = max(counts, key=lambda t: (counts[t], last[t]))
    return best, counts[best], sum(counts.values())


class RefMemory:
    """Dicts of exact n-grams with the memory's learn and decay rules."""

    def __init__(self, capacity: int, max_n: int) -> None:
        self.capacity, self.max_n = capacity, max_n
        self.contexts: dict[tuple, list[int]] = {}  # context -> [count, best, best_count]
        self.pairs: dict[tuple, int] = {}  # context + follower -> count

    @property
    def entries(self) -> int:
        return len(self.contexts) + len(self.pairs)

    def learn(self, tokens: list[int], first: int, end: int) -> None:
        for j in range(first, end):
            if self.entries + 2 * (self.max_n - 1) > self.capacity:
                self.decay()
            for n in range(1, min(self.max_n - 1, j) + 1):
                context = tuple(tokens[j - n : j])
                entry = self.contexts.setdefault(context, [0, -1, 0])
                entry[0] += 1
                pair = context + (tokens[j],)
                self.pairs[pair] = self.pairs.get(pair, 0) + 1
                if self.pairs[pair] >= entry[2]:
                    entry[1], entry[2] = tokens[j], self.pairs[pair]

    def decay(self) -> None:
        while self.entries > self.capacity // 2:
            self.contexts = {c: [e[0] // 2, e[1], e[2] // 2] for c, e in self.contexts.items() if e[0] // 2}
            self.pairs = {p: v // 2 for p, v in self.pairs.items() if v // 2}

    def predict(self, context: list[int]) -> tuple[int, int, int] | None:
        entry = self.contexts.get(tuple(context))
        return (entry[1], entry[2], entry[0]) if entry else None


class RefDrafter:
    """The `ngram` drafter's rules (module docstring of specdraft.drafters.ngram), written plainly."""

    def __init__(self, k, max_n=4, copy_min_n=1, min_confidence=0.5, adaptive=False, adapt_from_batch=1,
                 strong_copy_n=3, eos=(), memory=None):
        self.k, self.max_n, self.copy_min_n, self.min_confidence = k, max_n, copy_min_n, min_confidence
        self.adaptive, self.adapt_from_batch, self.strong_copy_n = adaptive, adapt_from_batch, strong_copy_n
        self.eos, self.memory = set(eos), memory
        self.ctx, self.prompt_length, self.k_cur, self.last, self.ignore_eos = {}, {}, {}, {}, {}

    def begin(self, rid, prompt, ignore_eos=False):
        self.ctx[rid], self.prompt_length[rid] = list(prompt), len(prompt)
        self.k_cur[rid], self.last[rid], self.ignore_eos[rid] = self.k, [], ignore_eos

    def propose(self, rid, limit, batch=1):
        ctx, draft = self.ctx[rid], []
        self.last[rid] = draft
        d = min(limit, self.k)
        start, n = ref_longest_match(ctx, self.copy_min_n, self.max_n)
        if self.adaptive and batch >= self.adapt_from_batch and n < self.strong_copy_n:
            d = min(d, self.k_cur[rid])

        def ends(token):
            return not self.ignore_eos[rid] and token in self.eos

        if start >= 0:
            for token in ctx[start : min(start + d, len(ctx))]:
                draft.append(token)
                if ends(token):
                    return draft
        while len(draft) < d:
            seq, pick = ctx + draft, None
            for n in range(min(self.max_n - 1, len(seq)), 0, -1):
                pick = ref_follower(ctx, seq[-n:])
                if pick is None and self.memory is not None and n < self.memory.max_n:
                    pick = self.memory.predict(seq[-n:])
                if pick is not None:
                    break
            if pick is None or pick[1] < self.min_confidence * pick[2]:
                break
            draft.append(pick[0])
            if ends(pick[0]):
                break
        return draft

    def accept(self, rid, tokens):
        last = self.last[rid]
        if last:
            accepted = 0
            while accepted < min(len(last), len(tokens)) and tokens[accepted] == last[accepted]:
                accepted += 1
            if accepted == 0:
                self.k_cur[rid] = max(1, self.k_cur[rid] // 2)
            elif accepted == len(last) >= self.k_cur[rid]:
                self.k_cur[rid] = min(self.k, self.k_cur[rid] + 2)
        self.last[rid] = []
        self.ctx[rid].extend(tokens)

    def end(self, rid):
        if self.memory is not None:
            self.memory.learn(self.ctx[rid], self.prompt_length[rid], len(self.ctx[rid]))
        del self.ctx[rid]
