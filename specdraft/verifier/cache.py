"""A KV cache with one row per request and a length per row, for stock transformers attention.

Rows are packed in slots 0..n-1 so the batch is always a view, never a gather. Rolling a row back
is setting its length: entries past it are masked out of attention and overwritten by the next
write. Only a row leaving the batch copies data (the last row moves into its slot).
The attention modules call `update(k, v, layer_idx)`, the part of transformers' Cache API they use.
"""

from __future__ import annotations

import torch


class RowKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.rows = 0
        self.lengths: list[int] = []  # host copy; the verifier knows every row's length without a sync
        self._keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self._values: list[torch.Tensor] = []
        self._allocate(slots=1, capacity=64)
        self._window: slice = slice(0, 0)
        self._write_index: torch.Tensor | None = None  # [batch, kv_heads, T, head_dim] positions to write
        self._kv_len = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "RowKVCache":
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        param = next(model.parameters())
        return cls(config.num_hidden_layers, num_kv_heads, head_dim, param.dtype, param.device)

    @property
    def capacity(self) -> int:
        return self._keys[0].shape[2]

    @property
    def slots(self) -> int:
        return self._keys[0].shape[0]

    def _allocate(self, slots: int, capacity: int) -> None:
        shape = (slots, self.num_kv_heads, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        old_len = max(self.lengths, default=0)
        for old, new in zip(self._keys + self._values, keys + values):
            new[: self.rows, :, :old_len] = old[: self.rows, :, :old_len]
        self._keys, self._values = keys, values

    def reserve(self, rows: int, length: int) -> None:
        """Make room for `rows` rows of `length` positions; grows geometrically (amortised copies)."""
        if rows > self.slots or length > self.capacity:
            self._allocate(max(rows, 2 * self.slots if rows > self.slots else self.slots),
                           max(length, 2 * self.capacity if length > self.capacity else self.capacity))

    def add_row(self) -> int:
        self.reserve(self.rows + 1, self.capacity)
        self.lengths.append(0)
        self.rows += 1
        return self.rows - 1

    def remove_row(self, slot: int) -> int | None:
        """Drop a row; the last row moves into its slot. Returns the moved row's old slot, if any."""
        last = self.rows - 1
        moved = None
        if slot != last:
            length = self.lengths[last]
            for buf in self._keys + self._values:
                buf[slot, :, :length] = buf[last, :, :length]
            self.lengths[slot] = length
            moved = last
        self.lengths.pop()
        self.rows -= 1
        return moved

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
        keys.scatter_(2, self._write_index, key_states)
        values.scatter_(2, self._write_index, value_states)
        return keys[:, :, : self._kv_len], values[:, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    is_compileable = False
