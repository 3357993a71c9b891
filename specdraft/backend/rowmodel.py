"""`RowModel`: a causal LM with one KV-cache row per request. The verifier owns one over the target,
the model drafter one over its draft model.

Rows join (`add`) and leave (`remove`) between forward passes. A row is *active* once `activate`d:
active rows fill slots 0..n-1, so a batched pass over them is a window of the cache, never a gather;
rows still being prefilled wait in the slots after them and run in passes of their own. A forward
pass feeds each row of a window T new tokens at the positions after its committed length; the owner
then `commit`s how many of them each row keeps (padding and rejected drafts are never committed),
and `truncate` rolls a row back. Lengths live on the host, so none of this syncs with the device.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from specdraft.backend import llama
from specdraft.backend.cache import RowKVCache


class RowModel:
    """model: a transformers causal LM (eval mode); layers: run only these decoder layers (a draft that
    skips layers; Llama family only); dtype: the activations' dtype for the own forward (default the
    model's)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        config = model.config
        if llama.supports(model):
            self._own = llama.LlamaForward(model, layers, dtype)
            num_layers, kv_heads, head_dim, cache_dtype = (len(self._own.layers), self._own.num_kv_heads,
                                                           self._own.head_dim, self._own.dtype)
        else:
            if layers is not None or dtype is not None:
                raise ValueError(f"running a subset of layers or another dtype needs a Llama-family model, "
                                 f"not {getattr(config, 'model_type', type(model).__name__)!r}")
            self._own = None
            num_layers = config.num_hidden_layers
            kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            cache_dtype = next(model.parameters()).dtype
        self.cache = RowKVCache(num_layers, kv_heads, head_dim, cache_dtype, self.device)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._order: list[str] = []  # row id in each slot
        self._slot: dict[str, int] = {}
        self._active = 0  # slots [0, _active) hold active rows
        self.forward_seconds = 0.0  # host time inside forward passes
        self.committed_tokens = 0  # tokens ever committed to the cache (what catching up has cost)

    # -- rows ----------------------------------------------------------------------------------
    def add(self, row_id: str, active: bool = False) -> None:
        assert row_id not in self._slot, f"row {row_id!r} added twice"
        self._slot[row_id] = self.cache.push_row()
        self._order.append(row_id)
        if active:
            self.activate(row_id)

    def activate(self, row_id: str) -> None:
        """Move a waiting row into the active window (its last slot)."""
        slot = self._slot[row_id]
        assert slot >= self._active, f"row {row_id!r} is already active"
        self._move(slot, self._active, swap=True)
        self._active += 1

    def remove(self, row_id: str) -> None:
        """Drop a row. Its slot is filled from the end of its group, so both groups stay packed."""
        hole = self._slot.pop(row_id)
        if hole < self._active:
            self._active -= 1
            if hole != self._active:
                self._move(self._active, hole)
            hole = self._active
        last = self.cache.rows - 1
        if hole != last:
            self._move(last, hole)
        self.cache.pop_row()
        self._order.pop()

    def _move(self, src: int, dst: int, swap: bool = False) -> None:
        if src == dst:
            return
        if swap:
            self.cache.swap_rows(src, dst)
            self._order[src], self._order[dst] = self._order[dst], self._order[src]
            self._slot[self._order[src]] = src
        else:
            self.cache.copy_row(src, dst)
            self._order[dst] = self._order[src]
        self._slot[self._order[dst]] = dst

    def __contains__(self, row_id: str) -> bool:
        return row_id in self._slot

    @property
    def active_ids(self) -> list[str]:
        """Active rows in slot order: the order of a batched pass's rows."""
        return self._order[: self._active]

    def slot(self, row_id: str) -> int:
        return self._slot[row_id]

    def length(self, row_id: str) -> int:
        """Tokens of the row committed to the cache."""
        return self.cache.lengths[self._slot[row_id]]

    def lengths(self, window: slice) -> list[int]:
        return self.cache.lengths[window]

    def commit(self, window: slice, counts: Sequence[int]) -> None:
        """Keep counts[b] of the tokens the last pass wrote for the b-th row of `window`."""
        for slot, n in zip(range(window.start, window.stop), counts):
            self.cache.lengths[slot] += int(n)
            self.committed_tokens += int(n)

    def truncate(self, row_id: str, length: int) -> None:
        """Roll a row back to its first `length` tokens."""
        slot = self._slot[row_id]
        assert 0 <= length <= self.cache.lengths[slot], (length, self.cache.lengths[slot])
        self.cache.lengths[slot] = length

    @property
    def active_window(self) -> slice:
        return slice(0, self._active)

    def window_of(self, row_id: str) -> slice:
        slot = self._slot[row_id]
        return slice(slot, slot + 1)

    # -- one forward pass ----------------------------------------------------------------------
    def forward(self, window: slice, input_ids: torch.Tensor | np.ndarray, logits_at: np.ndarray | None = None) -> torch.Tensor:
        """Feed the rows of `window` the tokens input_ids [batch, T] at the positions after their
        committed lengths; return logits [batch, T, vocab], or [batch, 1, vocab] at the positions
        logits_at [batch] (indices into T). Nothing is committed."""
        input_ids = torch.as_tensor(input_ids, dtype=torch.int64, device=self.device)
        batch, steps = input_ids.shape
        host_lengths = self.cache.lengths[window]
        lengths = torch.as_tensor(host_lengths, device=self.device)  # [batch]
        positions = lengths[:, None] + torch.arange(steps, device=self.device)[None, :]  # [batch, T]
        kv_len = max(host_lengths) + steps  # padding may reach past the context limit; it is never committed
        self.cache.prepare(window, positions, kv_len)
        # Row b's token at position t sees cache entries 0..t; stale entries past a row's length are hidden.
        visible = torch.arange(kv_len, device=self.device)[None, None, :] <= positions[:, :, None]  # [batch, T, kv]
        start = time.perf_counter()
        with torch.inference_mode():
            if self._own is not None:
                at = None if logits_at is None else torch.as_tensor(logits_at, dtype=torch.int64, device=self.device)
                logits = self._own(input_ids, positions, visible[:, None], self.cache, at)
            else:
                logits = self._stock(input_ids, positions, visible, logits_at)
        self.forward_seconds += time.perf_counter() - start
        return logits

    def _stock(self, input_ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
               logits_at: np.ndarray | None) -> torch.Tensor:
        mask = torch.zeros(visible.shape, dtype=self.cache.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.cache.dtype).min)
        steps = input_ids.shape[1]
        first = 0 if logits_at is None else int(np.min(logits_at))
        out = self.model(input_ids=input_ids, position_ids=positions, attention_mask=mask[:, None],  # [batch, 1, T, kv]
                         past_key_values=self.cache, use_cache=True, logits_to_keep=steps - first)
        logits = out.logits.float()  # [batch, T - first, vocab]
        if logits_at is None:
            return logits
        at = torch.as_tensor(np.asarray(logits_at) - first, dtype=torch.int64, device=self.device)
        return logits.gather(1, at[:, None, None].expand(len(at), 1, logits.shape[-1]))

    def prefill(self, row_id: str, token_ids: Sequence[int], chunk: int) -> torch.Tensor:
        """Feed one row `token_ids` in passes of at most `chunk` tokens and commit them; return the
        logits [vocab] after the last one."""
        window = self.window_of(row_id)
        ids = np.asarray(token_ids, dtype=np.int64)
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk][None, :]  # [1, T]
            logits = self.forward(window, piece, logits_at=np.array([piece.shape[1] - 1]))
            self.commit(window, [piece.shape[1]])
        return logits[0, -1]
