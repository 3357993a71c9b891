"""`PagedKVCache`: keys and values in pages of `SPAN` positions, one pool a layer [pages, kv_heads, SPAN,
head_dim] and a page table a row, so that a row holds its own length and no more: one 8k-token prompt
beside fifteen short rows costs its pages and theirs, not 16 x 8k positions. A page is one of the spans
the CPU step's attention reads at fixed offsets (`numba_layers.attend`), so paging changes which memory
a span is read from, never the arithmetic over it.

Moving a row to another slot moves its table, never its entries. The pool grows geometrically (a grown
pool keeps every page's number) and is compacted when it holds `SLACK` times the pages its rows use.
Page 0 is blank (zeros, never written): a pass's table points a row's spans past its pages there, so
every span a kernel visits is memory it may read (entries a token does not see are never used as
numbers), and torch's attention, reading a gathered copy (`update`), never meets a NaN it must mask.
"""

from __future__ import annotations

import numpy as np
import torch

from specdraft.backend.cache import SLACK, SPAN, KVCache

BLANK = 0  # the page a table gives spans a row has no page for


class PagedKVCache(KVCache):
    """pages: the pool's first size (a growable pool never shrinks below it)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 pages: int = 2) -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, dtype, device)
        self._tables: list[list[int]] = []  # per slot: its pages, in position order
        self._keys: list[torch.Tensor] = []  # per layer [pages, kv_heads, SPAN, head_dim]
        self._values: list[torch.Tensor] = []
        self._free: list[int] = []
        self._least = max(2, pages)
        self._grow(self._least)
        self.table = np.zeros((0, 0), np.int64)  # the prepared pass's [batch, spans]: its rows' pages
        self._positions: torch.Tensor | None = None  # the prepared pass's [batch, T]
        self._write_at: tuple[torch.Tensor, ...] | None = None  # the table, then pages, offsets [batch, T] to write

    @property
    def pages(self) -> int:
        """Pages in the pool (the blank one included)."""
        return self._keys[0].shape[0]

    @property
    def used_pages(self) -> int:
        """Pages the rows hold."""
        return sum(len(t) for t in self._tables)

    def _pool(self, pages: int) -> list[torch.Tensor]:
        shape = (pages, self.num_kv_heads, SPAN, self.head_dim)
        return [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]

    def _grow(self, pages: int) -> None:
        """A pool of `pages` pages holding the old one's at the same numbers; the new ones free."""
        old = self.pages if self._keys else 1  # page 0, the blank one, is never free
        keys, values = self._pool(pages), self._pool(pages)
        for mine, new in zip(self._keys + self._values, keys + values):
            new[: mine.shape[0]] = mine
        self._keys, self._values = keys, values
        self._free.extend(range(pages - 1, old - 1, -1))  # lowest numbers taken first
        self._reallocated()

    def _fit(self) -> None:
        """Compact a pool that holds `SLACK` times the pages its rows use into one twice their size (no
        smaller than its first): the rows' pages renumbered in order, their tables rewritten."""
        used = 1 + self.used_pages
        if self.pages < SLACK * max(used, self._least):
            return
        order = [page for table in self._tables for page in table]
        index = torch.as_tensor([BLANK, *order], device=self.device)
        keys, values = self._pool(max(self._least, 2 * used)), self._pool(max(self._least, 2 * used))
        for mine, new in zip(self._keys + self._values, keys + values):
            new[:used] = mine[index]
        self._keys, self._values = keys, values
        number = 1
        for table in self._tables:
            table[:] = range(number, number + len(table))
            number += len(table)
        self._free = list(range(self.pages - 1, number - 1, -1))
        self._reallocated()

    def _room(self, slot: int, length: int) -> None:
        """Pages in the row's table for its first `length` positions."""
        table = self._tables[slot]
        wanted = -(-length // SPAN) - len(table)
        if wanted <= 0:
            return
        if wanted > len(self._free):
            self._grow(max(self.pages + wanted - len(self._free), 2 * self.pages))
        for _ in range(wanted):
            table.append(self._free.pop())

    def _release(self, slot: int) -> None:
        self._free.extend(reversed(self._tables[slot]))
        self._tables[slot] = []

    # -- slots (the owner decides which row lives where) -------------------------------------
    def push_row(self) -> int:
        """A new empty row in the next free slot; returns its slot."""
        self.lengths.append(0)
        self._tables.append([])
        return self.rows - 1

    def pop_row(self) -> None:
        """Drop the row in the last slot: its pages go back to the pool (compacted where it is far
        larger than the rest need: `_fit`)."""
        self._release(self.rows - 1)
        self._tables.pop()
        self.lengths.pop()
        self._fit()

    def move_row(self, src: int, dst: int) -> None:
        """Make slot `dst` hold what slot `src` holds (its table and length; `dst`'s pages go back to the
        pool); `src` is left empty, the owner's to drop next."""
        if src == dst:
            return
        self._release(dst)
        self._tables[dst], self._tables[src] = self._tables[src], []
        self.lengths[dst], self.lengths[src] = self.lengths[src], 0

    def truncate(self, slot: int, length: int) -> None:
        """Roll the row back to its first `length` positions; the pages past them go back to the pool."""
        super().truncate(slot, length)
        table = self._tables[slot]
        keep = -(-length // SPAN)
        self._free.extend(reversed(table[keep:]))
        del table[keep:]

    def swap_rows(self, a: int, b: int) -> None:
        self._tables[a], self._tables[b] = self._tables[b], self._tables[a]
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]

    def _at(self, slot: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages and offsets in them of the row's positions [start, stop): ([n], [n])."""
        positions = np.arange(start, stop)
        pages = np.asarray(self._tables[slot], np.int64)[positions // SPAN]
        return (torch.as_tensor(pages, device=self.device),
                torch.as_tensor(positions % SPAN, device=self.device))

    def read(self, slot: int, start: int, stop: int) -> torch.Tensor:
        """Positions [start, stop) of a row's committed entries, every layer: [2, layers, kv_heads,
        stop - start, head_dim] (keys, then values): a new tensor."""
        assert 0 <= start <= stop <= self.lengths[slot], (start, stop, self.lengths[slot])
        pages, offsets = self._at(slot, start, stop)
        return torch.stack([torch.stack([pool[pages, :, offsets].transpose(0, 1) for pool in pools])
                            for pools in (self._keys, self._values)])

    def write(self, slot: int, start: int, entries: torch.Tensor) -> None:
        """Make entries [2, layers, kv_heads, n, head_dim] (as `read` gives them) the row's positions
        [start, start + n), after its own first `start`; its length becomes start + n."""
        n = entries.shape[3]
        assert start <= self.lengths[slot], (start, self.lengths[slot])
        self._room(slot, start + n)
        pages, offsets = self._at(slot, start, start + n)
        for layer in range(self.num_layers):
            self._keys[layer][pages, :, offsets] = entries[0, layer].transpose(0, 1).to(self.dtype)  # [n, kv_heads, head_dim]
            self._values[layer][pages, :, offsets] = entries[1, layer].transpose(0, 1).to(self.dtype)
        self.lengths[slot] = start + n

    def entries(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed keys and values of one row: ([kv_heads, length, head_dim], same), copies."""
        pages, offsets = self._at(slot, 0, self.lengths[slot])
        return (self._keys[layer][pages, :, offsets].transpose(0, 1),
                self._values[layer][pages, :, offsets].transpose(0, 1))

    # -- one forward pass ----------------------------------------------------------------
    def prepare(self, window: slice, positions: torch.Tensor, kv_len: int) -> None:
        """Set the rows (`window` of slots) and positions the next forward pass writes: pages for each
        row's, and the pass's table (`table`: each row's pages for the spans of `kv_len` entries, the
        blank page past its own).

        positions: [batch, T] absolute positions of the new tokens in each row, from its length on.
        """
        batch, steps = positions.shape
        assert window.stop - window.start == batch, (window, batch)
        spans = -(-kv_len // SPAN)
        table = np.full((batch, spans), BLANK, np.int64)
        for b, slot in enumerate(range(window.start, window.stop)):
            self._room(slot, self.lengths[slot] + steps)
            pages = self._tables[slot][:spans]
            table[b, : len(pages)] = pages
        self._window, self._kv_len, self.table = window, kv_len, table
        self._positions, self._write_at = positions, None  # made where a pass writes through `update`

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_args, **_kwargs):
        """Write the new keys/values ([batch, kv_heads, T, head_dim]) into their pages and return the
        rows' entries gathered ([batch, kv_heads, kv_len, head_dim], copies; the blank page's zeros past
        each row's pages)."""
        if self._write_at is None:  # once a pass, not once a layer
            table = torch.as_tensor(self.table, device=self.device)  # [batch, spans]
            self._write_at = (table, table.gather(1, self._positions // SPAN), self._positions % SPAN)
        table, pages, offsets = self._write_at
        out = []
        for pool, new in ((self._keys[layer_idx], key_states), (self._values[layer_idx], value_states)):
            pool[pages, :, offsets] = new.transpose(1, 2).to(self.dtype)  # [batch, T, kv_heads, head_dim]
            rows = pool[table].transpose(1, 2)  # [batch, kv_heads, spans, SPAN, head_dim]
            out.append(rows.reshape(*rows.shape[:2], -1, self.head_dim)[:, :, : self._kv_len])
        return out[0], out[1]

    def pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's keys and values pools ([pages, kv_heads, SPAN, head_dim]), for a forward that
        writes its new entries itself, through the prepared pass's `table`."""
        return self._keys, self._values
