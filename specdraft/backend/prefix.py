"""`PrefixCache`: the committed keys and values of earlier requests, kept so that a later request whose
prompt starts with the same tokens copies them instead of computing them again.

A radix tree over token ids, one tree per cache salt (requests with different salts share nothing).
Each node holds a run of tokens and their entries, [2, layers, kv_heads, n, head_dim] (keys, values),
in its own storage; a node's tokens follow its parent's. A lookup walks down from the root as far as
the prompt agrees, token by token (a match may end inside a node: it takes that node's first tokens);
storing a row walks down the same way, splits the node where the row's tokens part from it, and hangs
what is new below. So a conversation re-sent every turn holds its history once, each turn adding a
leaf, and prompts that share only a system prompt share its node.

Why a tree of runs, not vLLM's hashed fixed-size blocks: a hit reuses every token of the shared prefix,
not the whole blocks of it (an agent's new turn usually parts from the stored one inside a block), a
node copies into a row (`KVCache.write`: a contiguous run, or the run's pages) in one copy a layer, not one a block, and the number
of nodes stays small (one per branch, not one per 16 tokens), so the least recently used leaf is found
by a scan. Entries are only ever copied in and out: the rows' storage is untouched, so a request that
is cancelled, fails or rolls back a draft leaves nothing here but what a finished step committed.

Bounded by `budget` bytes: after each store the least recently used leaves are dropped (a lookup or a
store uses every node on its path) until the entries fit. Single-threaded, as the engine is.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from specdraft.backend.cache import KVCache
from specdraft.results import PrefixStats


@dataclass(eq=False)
class _Node:
    tokens: np.ndarray  # [n] int64: this node's run
    entries: torch.Tensor | None  # [2, layers, kv_heads, n, head_dim]; None at a root
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)  # by first token
    used: int = 0  # the tick of the last lookup or store that passed through it

    def agree(self, tokens: np.ndarray) -> int:
        """How many of this node's first tokens equal `tokens`' first."""
        n = min(len(self.tokens), len(tokens))
        differ = np.flatnonzero(self.tokens[:n] != tokens[:n])
        return int(differ[0]) if len(differ) else n


class PrefixCache:
    """budget: bytes its entries may hold; entries are those of caches of one layout and dtype."""

    def __init__(self, budget: int) -> None:
        if budget <= 0:
            raise ValueError(f"a prefix cache needs a positive budget in bytes, got {budget}")
        self.budget = budget
        self.stats = PrefixStats()
        self._roots: dict[str | None, _Node] = {}
        self._tick = itertools.count(1)
        self._token_bytes: int | None = None  # bytes of one token's entries, known at the first store

    @property
    def tokens(self) -> int:
        """Tokens whose entries it holds."""
        return 0 if not self._token_bytes else self.stats.bytes // self._token_bytes

    def _walk(self, salt: str | None, tokens: np.ndarray, tick: int) -> list[tuple[_Node, int]]:
        """The nodes the longest stored prefix of `tokens` runs through, each with how many of its tokens
        it takes (all but maybe the last's), marked used."""
        node, path, at = self._roots.get(salt), [], 0
        while node is not None and at < len(tokens):
            child = node.children.get(int(tokens[at]))
            if child is None:
                break
            n = child.agree(tokens[at:])
            child.used = tick
            path.append((child, n))
            at += n
            if n < len(child.tokens):
                break
            node = child
        return path

    def length(self, salt: str | None, tokens: Sequence[int], limit: int) -> int:
        """How many tokens of the longest stored prefix of `tokens` (at most `limit`) `read_prefix` would take."""
        return sum(n for _, n in self._walk(salt, np.asarray(tokens[:limit], dtype=np.int64), next(self._tick)))

    def read_prefix(self, cache: KVCache, slot: int, salt: str | None, tokens: Sequence[int], limit: int) -> int:
        """Copy the entries of the longest stored prefix of `tokens` (at most `limit` tokens) into the
        empty row in `slot`; return how many tokens it took (the row's new length)."""
        assert cache.lengths[slot] == 0, "a prefix is read into an empty row"
        at = 0
        for node, n in self._walk(salt, np.asarray(tokens[:limit], dtype=np.int64), next(self._tick)):
            cache.write(slot, at, node.entries[:, :, :, :n])
            at += n
        return at

    def store_prefix(self, cache: KVCache, slot: int, salt: str | None, tokens: Sequence[int]) -> None:
        """Keep the committed entries of the row in `slot` whose tokens are `tokens` (its first
        len(tokens) positions): what is not stored yet is copied out of the row; then the budget is kept."""
        tokens = np.asarray(tokens, dtype=np.int64)
        assert len(tokens) <= cache.lengths[slot], (len(tokens), cache.lengths[slot])
        if not len(tokens):
            return
        tick = next(self._tick)
        root = self._roots.setdefault(salt, _Node(np.empty(0, np.int64), None, None))
        path = self._walk(salt, tokens, tick)
        at = sum(n for _, n in path)
        parent = root if not path else path[-1][0]
        if path and path[-1][1] < len(parent.tokens):  # the row parts from this node inside it: split it
            parent = self._split(parent, path[-1][1])
        if at < len(tokens):
            entries = cache.read(slot, at, len(tokens))  # a copy of its own
            if self._token_bytes is None:
                self._token_bytes = entries[:, :, :, :1].numel() * entries.element_size()
            leaf = _Node(tokens[at:].copy(), entries, parent, used=tick)
            parent.children[int(tokens[at])] = leaf
            self.stats.bytes += entries.numel() * entries.element_size()
        self._evict()

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node` after its first n tokens: a new node holds them, `node` keeps the rest below it."""
        head = _Node(node.tokens[:n].copy(), node.entries[:, :, :, :n].clone(), node.parent, used=node.used)
        node.parent.children[int(node.tokens[0])] = head
        node.tokens, node.entries, node.parent = node.tokens[n:].copy(), node.entries[:, :, :, n:].clone(), head
        head.children[int(node.tokens[0])] = node
        return head

    def _evict(self) -> None:
        while self.stats.bytes > self.budget:
            leaves = [node for root in self._roots.values() for node in _below(root) if not node.children]
            if not leaves:
                return
            oldest = min(leaves, key=lambda node: node.used)
            del oldest.parent.children[int(oldest.tokens[0])]
            self.stats.bytes -= oldest.entries.numel() * oldest.entries.element_size()
            self.stats.evicted_tokens += len(oldest.tokens)
            self.stats.evictions += 1
        for salt in [s for s, root in self._roots.items() if not root.children]:
            del self._roots[salt]


def _below(node: _Node):
    stack = list(node.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())
