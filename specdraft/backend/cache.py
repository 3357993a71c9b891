"""The KV cache's rows: keys and values for rows in slots 0..rows-1, a committed length per slot, in one
of two layouts behind one interface (`KVCache`).

A forward pass writes its new entries at each row's positions past its length; the owner then commits
how many of them to keep, and rolling back is lowering a length: entries past it are masked out of
attention and overwritten by later writes. `update(k, v, layer_idx)` is the part of transformers'
Cache API that its attention modules call, so the stock model can run on either layout.

- `RowKVCache` (here): one block [slots, kv_heads, capacity, head_dim] a layer, so that a batch of
  neighbouring rows is a view, never a gather (what torch's attention, the Triton kernels and captured
  CUDA graphs read); every slot holds the longest row's capacity.
- `paged.PagedKVCache`: pages of `SPAN` positions from one pool a layer and a page table a row, so
  that a row holds only its own length (one long prompt beside short rows costs its own pages, not
  the longest row's length in every slot); what the CPU step's kernels read (`numba_layers.attend`).
"""

from __future__ import annotations

import torch

SPAN = 128  # capacity is a whole number of these: attention kernels read a token's keys in spans at fixed offsets
SLACK = 4  # a growable cache shrinks where it holds this many times what its rows need


class KVCache:
    """What both layouts share: the rows' committed lengths (on the host: no device sync to know
    one), what others derived from the buffers, and the moves that are length arithmetic."""

    fixed = False

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        # per slot, on the host; written here only (`commit`, `truncate`, the moves)
        self.lengths: list[int] = []
        self.generation = 0  # counts allocations: what `derived` made of the buffers stays valid while it holds
        self._derived: dict[tuple, object] = {}
        self._window: slice = slice(0, 0)
        self._kv_len = 0

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def layout(self) -> tuple[int, int, int]:
        """What an entry is: (layers, kv heads, head dim); caches of one layout can share entries."""
        return self.num_layers, self.num_kv_heads, self.head_dim

    @property
    def window(self) -> slice:
        """The slots the prepared pass runs on."""
        return self._window

    def _reallocated(self) -> None:
        self._derived.clear()
        self.generation += 1

    def derived(self, key: tuple, make):
        """What `make()` builds from the buffers (views, a kernel's typed lists of them), kept under `key`
        until the buffers change: nothing outside the cache holds a resized-away buffer alive."""
        if key not in self._derived:
            if len(self._derived) >= 8:  # a few windows at a time (the batch, a prefilling row)
                self._derived.clear()
            self._derived[key] = make()
        return self._derived[key]

    def copy_from(self, other: KVCache, src: int, dst: int, start: int, stop: int) -> None:
        """Make slot `dst` hold positions [start, stop) of `other`'s slot `src` after its own first
        `start` (a cache of the same layers and heads, either layout; its dtype converted); its length
        becomes `stop`."""
        assert other.layout == self.layout, (other.layout, self.layout)
        assert start <= self.lengths[dst] and stop <= other.lengths[src], (start, self.lengths[dst], stop)
        self.write(dst, start, other.read(src, start, stop))

    def commit(self, slot: int, n: int) -> None:
        """Keep the next n entries the last pass wrote for the row (its length grows by n)."""
        self.lengths[slot] += n

    def truncate(self, slot: int, length: int) -> None:
        """Roll the row back to its first `length` positions."""
        assert 0 <= length <= self.lengths[slot], (length, self.lengths[slot])
        self.lengths[slot] = length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    is_compileable = False

    # Each layout's own: push_row, pop_row, move_row, swap_rows, read, write, entries, prepare, update.


class RowKVCache(KVCache):
    """One block a layer: rows packed in slots, so that a batch of neighbouring rows is a view. Storage
    grows geometrically (or is reserved up front), and shrinks when it holds `SLACK` times what its rows
    need (`_fit`); only moving a row to another slot, or a resize, copies entries."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 slots: int = 1, capacity: int = 64, fixed: bool = False) -> None:
        """fixed: allocated once at this size (captured CUDA graphs hold its addresses): never grows.
        Capacities are whole numbers of `SPAN` positions."""
        super().__init__(num_layers, num_kv_heads, head_dim, dtype, device)
        self.fixed = fixed
        self._keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self._values: list[torch.Tensor] = []
        self._least = (slots, -(-capacity // SPAN) * SPAN)  # a growable cache never shrinks below its first size
        self._allocate(slots, capacity)
        self._write_index: torch.Tensor | None = None  # [batch, kv_heads, T, head_dim] positions to write

    @property
    def capacity(self) -> int:
        return self._keys[0].shape[2]

    @property
    def slots(self) -> int:
        return self._keys[0].shape[0]

    def _allocate(self, slots: int, capacity: int) -> None:
        capacity = -(-capacity // SPAN) * SPAN
        shape = (slots, self.num_kv_heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        used = max(self.lengths, default=0)
        for old, new in zip(self._keys + self._values, keys + values):
            new[: self.rows, :, :used] = old[: self.rows, :, :used]
        self._keys, self._values = keys, values
        self._reallocated()

    def _fit(self) -> None:
        """Shrink a growable cache that holds `SLACK` times the slots or positions its rows need, to
        twice what they need (no smaller than its first size): geometric both ways, so a row that
        comes and goes costs amortised copies, and a long prompt's room goes when it does."""
        least_slots, least_capacity = self._least
        rows, longest = self.rows, max(self.lengths, default=0)
        if self.fixed or (self.slots < SLACK * max(rows, least_slots)
                          and self.capacity < SLACK * max(longest, least_capacity)):
            return
        self._allocate(max(least_slots, 2 * rows), max(least_capacity, 2 * longest))

    def reserve(self, rows: int, length: int) -> None:
        """Room for `rows` rows of `length` positions; grows geometrically (amortised copies)."""
        if rows > self.slots or length > self.capacity:
            if self.fixed:
                raise RuntimeError(f"the fixed KV cache holds {self.slots} rows of {self.capacity} positions; "
                                   f"{rows} rows of {length} were needed")
            self._allocate(max(rows, 2 * self.slots if rows > self.slots else self.slots),
                           max(length, 2 * self.capacity if length > self.capacity else self.capacity))

    # -- slots (the owner decides which row lives where) -------------------------------------
    def push_row(self) -> int:
        """A new empty row in the next free slot; returns its slot."""
        self.reserve(self.rows + 1, self.capacity)
        self.lengths.append(0)
        return self.rows - 1

    def pop_row(self) -> None:
        """Drop the row in the last slot (the storage shrinks where it is far larger than the rest need: `_fit`)."""
        self.lengths.pop()
        self._fit()

    def move_row(self, src: int, dst: int) -> None:
        """Make slot `dst` hold what slot `src` holds (its committed entries and length); `src` is left
        empty, the owner's to drop next."""
        if src == dst:
            return
        length = self.lengths[src]
        for buf in self._keys + self._values:
            buf[dst, :, :length] = buf[src, :, :length]
        self.lengths[dst], self.lengths[src] = length, 0

    def swap_rows(self, a: int, b: int) -> None:
        if a == b:
            return
        length = max(self.lengths[a], self.lengths[b])
        for buf in self._keys + self._values:
            buf[[a, b], :, :length] = buf[[b, a], :, :length]
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]

    def read(self, slot: int, start: int, stop: int) -> torch.Tensor:
        """Positions [start, stop) of a row's committed entries, every layer: [2, layers, kv_heads,
        stop - start, head_dim] (keys, then values): a new tensor."""
        assert 0 <= start <= stop <= self.lengths[slot], (start, stop, self.lengths[slot])
        return torch.stack([torch.stack([buf[slot, :, start:stop] for buf in bufs]) for bufs in (self._keys, self._values)])

    def write(self, slot: int, start: int, entries: torch.Tensor) -> None:
        """Make entries [2, layers, kv_heads, n, head_dim] (as `read` gives them) the row's positions
        [start, start + n), after its own first `start`; its length becomes start + n."""
        n = entries.shape[3]
        assert start <= self.lengths[slot], (start, self.lengths[slot])
        self.reserve(self.rows, start + n)
        for layer in range(self.num_layers):
            self._keys[layer][slot, :, start : start + n] = entries[0, layer]
            self._values[layer][slot, :, start : start + n] = entries[1, layer]
        self.lengths[slot] = start + n

    def entries(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The committed keys and values of one row: ([kv_heads, length, head_dim], same)."""
        length = self.lengths[slot]
        return self._keys[layer][slot, :, :length], self._values[layer][slot, :, :length]

    # -- one forward pass ----------------------------------------------------------------
    def prepare(self, window: slice, positions: torch.Tensor, kv_len: int) -> None:
        """Set the rows (`window` of slots) and positions the next forward pass writes.

        positions: [batch, T] absolute positions of the new tokens in each row.
        """
        batch, steps = positions.shape
        assert window.stop - window.start == batch, (window, batch)
        self.reserve(window.stop, kv_len)
        self._window, self._kv_len = window, kv_len
        self._write_index = positions[:, None, :, None].expand(batch, self.num_kv_heads, steps, self.head_dim)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_args, **_kwargs):
        """Write the new keys/values ([batch, kv_heads, T, head_dim]) and return the rows' full views."""
        keys = self._keys[layer_idx][self._window]  # [batch, kv_heads, capacity, head_dim], a view
        values = self._values[layer_idx][self._window]
        keys.scatter_(2, self._write_index, key_states.to(self.dtype))
        values.scatter_(2, self._write_index, value_states.to(self.dtype))
        return keys[:, :, : self._kv_len], values[:, :, : self._kv_len]

    def window_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The prepared pass's rows' keys and values, per layer ([batch, kv_heads, capacity, head_dim]
        views), for a forward that writes its new entries itself, at the positions `prepare` was given."""
        return [k[self._window] for k in self._keys], [v[self._window] for v in self._values]
