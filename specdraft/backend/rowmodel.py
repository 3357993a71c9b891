"""`RowModel`: a causal LM with one KV-cache row per request. The verifier owns one over the target,
the model drafter one over its draft model.

Rows join (`add`) and leave (`remove`) between forward passes. A row is *active* once `activate`d:
active rows fill slots 0..n-1, so a batched pass over them is a window of the cache, never a gather;
rows still being prefilled wait in the slots after them and run in passes of their own. A forward
pass feeds each row of a window T new tokens at the positions after its committed length; the owner
then `commit`s how many of them each row keeps (padding and rejected drafts are never committed),
and `truncate` rolls a row back. Lengths live on the host, so none of this syncs with the device.

A row's prompt is prefilled in chunks at fixed positions (`chunks.PrefillChunks`: boundaries from the
row's start, at most `prefill_chunk` tokens apart and closer as attention's share of a pass grows),
whoever feeds it and in whatever parts, so where the chunks fall never depends on a step's budget. The
chunks have this one owner (`RowModel.chunks`); a caller that budgets prefill reads their sizes and
costs there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specdraft.backend import forward, memory
from specdraft.backend.chunks import PrefillChunks
from specdraft.backend.family import FAMILIES, attention_shape
from specdraft.backend.cache import RowKVCache
from specdraft.backend.paged import PagedKVCache
from specdraft.backend.prefix import PrefixCache
from specdraft.params import PREFILL_CHUNK

MIN_PREFILL_WIDTH = 16  # the narrowest padded prefill pass (`RowModel._static_width`)


@dataclass(frozen=True)
class StaticShapes:
    """Fixed shapes for batched passes, so that each shape can be captured once and replayed.

    A batched pass over n active rows runs padded to a batch bucket (the next power of two, at most
    `max_rows`) and attends over a KV bucket (its longest row rounded up to `kv_block`); its inputs
    go into device buffers kept per shape. The cache is allocated for `max_rows` x `max_context` at
    start and never grows. With `graphs` (CUDA only) each shape is captured in a CUDA graph on first
    use and replayed after: one launch instead of one per kernel.
    """

    max_rows: int
    max_context: int
    kv_block: int = 256
    graphs: bool = True

    def batch_bucket(self, rows: int) -> int:
        assert 1 <= rows <= self.max_rows, (rows, self.max_rows)
        return min(1 << (rows - 1).bit_length(), self.max_rows)

    def kv_bucket(self, length: int) -> int:
        return min(-(-length // self.kv_block) * self.kv_block, self.max_context + self.kv_block)


@dataclass(frozen=True)
class Forwarded:
    """What one forward pass gives: its logits, and whether it ran at its shape's steady cost. A pass
    at a static shape that runs eagerly to warm the shape up, or that captures its graph, is not
    steady (it costs several replays); its time says nothing about what the shape costs."""

    logits: torch.Tensor
    steady: bool


@dataclass
class _Shape:
    """Device buffers (and, once captured, the graph) of one static shape; `calls`: passes run at it."""

    input_ids: torch.Tensor  # [bucket, T]
    lengths: torch.Tensor  # [bucket]
    logits_at: torch.Tensor | None  # [bucket]
    graph: object = None
    logits: torch.Tensor | None = None  # the graph's output
    calls: int = 0


class RowModel:
    """model: a transformers causal LM (eval mode); layers: run only these decoder layers (a draft that
    skips layers; our forward's families only, `family.FAMILIES`); dtype: the activations' dtype for the own
    forward (default the model's); static: run batched passes at static shapes (`StaticShapes`; our
    forward's families only); compiled:
    on CPU, run passes of a few tokens compiled; kernels: which kernels run our own forward
    (`forward.OwnForward`: auto, triton or torch); prefill_chunk: the most tokens a prefill pass
    takes, its passes at fixed positions, fewer as the positions grow (`chunks.PrefillChunks`)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 static: StaticShapes | None = None, compiled: bool = False, kernels: str = "auto",
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        config = model.config
        if forward.supports(model):
            self._own = forward.OwnForward(model, layers, dtype, compiled=compiled, kernels=kernels)
            num_layers, kv_heads, head_dim, cache_dtype = (len(self._own.layers), self._own.family.kv_heads,
                                                           self._own.family.head_dim, self._own.dtype)
        else:
            if layers is not None or dtype is not None:
                kind = getattr(config, "model_type", type(model).__name__)
                raise ValueError(f"running a subset of layers or another dtype needs a model of a family our forward "
                                 f"runs ({', '.join(FAMILIES)}), not {kind!r}")
            self._own = None
            num_layers = config.num_hidden_layers
            _, kv_heads, head_dim = attention_shape(config)
            cache_dtype = next(model.parameters()).dtype
        if static is not None and self._own is None:
            raise ValueError(f"static shapes need a model of a family our forward runs ({', '.join(FAMILIES)})")
        if static is not None and self._own.reads_pages:
            raise ValueError("static shapes (a fixed cache, for CUDA graphs) and the compiled CPU step (whose attention "
                             "reads a paged cache) do not combine: leave static shapes out on CPU")
        self.static = static
        # Paged where the CPU step's layers read pages in place (a row then holds its own length, not the
        # longest row's); else one block a layer, which torch's attention and the Triton kernels read as
        # views. A static cache is allocated whole (with room for a KV bucket's overhang): no step grows it.
        if static is None and self._own is not None and self._own.reads_pages:
            self.cache = PagedKVCache(num_layers, kv_heads, head_dim, cache_dtype, self.device)
        else:
            slots, capacity = (static.max_rows, static.max_context + static.kv_block) if static else (1, 64)
            self.cache = RowKVCache(num_layers, kv_heads, head_dim, cache_dtype, self.device, slots, capacity,
                                    fixed=static is not None)
        self.chunks = PrefillChunks(config, num_layers, prefill_chunk, self.device.type == "cpu")
        self._shapes: dict[tuple, _Shape] = {}
        self.vocab_size = int(model.get_output_embeddings().out_features)
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
        """Drop a row. Its slot is filled from the end of its group, so both groups stay packed; the memory a
        long row took is handed back (`memory.return_freed`)."""
        hole = self._slot.pop(row_id)
        long = self.cache.lengths[hole] > self.prefill_chunk
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
        if long:  # what its prefill and its room took goes back to the system, not just to the heap
            memory.return_freed()

    def _move(self, src: int, dst: int, swap: bool = False) -> None:
        if src == dst:
            return
        if swap:
            self.cache.swap_rows(src, dst)
            self._order[src], self._order[dst] = self._order[dst], self._order[src]
            self._slot[self._order[src]] = src
        else:
            self.cache.move_row(src, dst)
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
            self.cache.commit(slot, int(n))
            self.committed_tokens += int(n)

    def take_entries(self, row_id: str, source: RowModel, stop: int) -> int:
        """Extend the row's cache up to `stop` positions with the keys and values that `source` (a
        model of the same layout whose entries mean the same: the target, for a draft that is a copy
        of it) has committed for the row of the same id, instead of computing them. Returns how many
        positions it took: none where `source` has no such row or holds no more."""
        if row_id not in source:
            return 0
        start, stop = self.length(row_id), min(stop, source.length(row_id))
        if stop <= start:
            return 0
        self.cache.copy_from(source.cache, source.slot(row_id), self.slot(row_id), start, stop)
        return stop - start

    def read_prefix(self, row_id: str, prefixes: PrefixCache, salt: str | None, tokens: Sequence[int], limit: int) -> int:
        """Fill the empty row with the stored entries of the longest prefix of `tokens` (at most `limit`)
        that `prefixes` holds under `salt`; return how many positions it took."""
        return prefixes.read_prefix(self.cache, self._slot[row_id], salt, tokens, limit)

    def store_prefix(self, row_id: str, prefixes: PrefixCache, salt: str | None, tokens: Sequence[int]) -> None:
        """Keep the row's committed entries of its first len(tokens) positions (`tokens`, at most its
        length) in `prefixes` under `salt`."""
        prefixes.store_prefix(self.cache, self._slot[row_id], salt, tokens)

    def truncate(self, row_id: str, length: int) -> None:
        """Roll a row back to its first `length` tokens."""
        self.cache.truncate(self._slot[row_id], length)

    @property
    def active_window(self) -> slice:
        return slice(0, self._active)

    def window_of(self, row_id: str) -> slice:
        slot = self._slot[row_id]
        return slice(slot, slot + 1)

    # -- one forward pass ----------------------------------------------------------------------
    @property
    def compiled_tokens(self) -> int:
        """The longest pass that runs compiled (0: none does)."""
        return 0 if self._own is None else self._own.compiled_tokens

    @property
    def compiled_layers(self):
        """The compiled layers a short pass runs (`NumbaLayers` or inductor's), or None."""
        return None if self._own is None else self._own.compiled

    @property
    def invariant_layers(self):
        """The batch-invariant Triton layers every pass runs on CUDA (`TritonLayers`), or None."""
        return None if self._own is None else self._own.invariant

    @property
    def family(self):
        """The model's `Family` as our own forward reads it; None where the stock model runs."""
        return None if self._own is None else self._own.family

    @property
    def own_forward(self) -> bool:
        """Whether our own forward runs the model (a family it reproduces), not the stock model."""
        return self._own is not None

    def keep_vocabulary(self, tokens: int) -> bool:
        """Where the compiled layers can (`NumbaLayers.keep_vocabulary`), compute only the logits of ids
        below `tokens` from now on, the output layer's other rows never read, and say so; False where
        the layers that run compute them all (the caller masks the others itself)."""
        layers = self.compiled_layers
        if not hasattr(layers, "keep_vocabulary"):
            return False
        layers.keep_vocabulary(tokens)
        return True

    def also_rows(self, ids: np.ndarray) -> None:
        """Beside the ids `keep_vocabulary` keeps, compute the logits of `ids` too in the passes that
        follow (`NumbaLayers.also_rows`); only after `keep_vocabulary` said True."""
        self.compiled_layers.also_rows(ids)

    @property
    def reads_kept_vocabulary(self) -> bool:
        """Whether the layers that run could keep a vocabulary (`keep_vocabulary`) without keeping one."""
        return hasattr(self.compiled_layers, "keep_vocabulary")

    @property
    def packs(self) -> bool:
        """Whether a packed pass (`packed_pass`) computes only the tokens fed (our own forward, not at
        static shapes); otherwise it runs padded, batch x the most a row is fed."""
        return self._own is not None and self.static is None

    def forward(self, window: slice, input_ids: torch.Tensor | np.ndarray, logits_at: np.ndarray | None = None) -> torch.Tensor:
        """`forward_pass`'s logits."""
        return self.forward_pass(window, input_ids, logits_at).logits

    def forward_pass(self, window: slice, input_ids: torch.Tensor | np.ndarray, logits_at: np.ndarray | None = None) -> Forwarded:
        """Feed the rows of `window` the tokens input_ids [batch, T] at the positions after their
        committed lengths; return logits [batch, T, vocab], or [batch, 1, vocab] at the positions
        logits_at [batch] (indices into T), and whether the pass was steady (`Forwarded`). Nothing is
        committed."""
        if self.static is not None and window.start == 0:
            return self._forward_static(window, input_ids, logits_at)
        input_ids = torch.as_tensor(input_ids, dtype=torch.int64, device=self.device)
        return self._pass(window, input_ids, input_ids.shape[1], logits_at=logits_at)

    def packed_pass(self, window: slice, tokens: np.ndarray, feeds: np.ndarray, last: bool = False) -> Forwarded:
        """Feed row b of `window` the next feeds[b] of the flat tokens [N] (in window order; 0: the row
        sits the pass out) at the positions after its committed length. Returns logits [N, vocab], each
        fed token's, in the same layout; or, where `last`, [fed rows, vocab] at each fed row's last
        token. Where the model `packs`, only the fed tokens are computed; elsewhere the pass runs padded
        (batch x the most a row is fed) and the fed tokens' logits are picked out. Nothing is committed."""
        feeds = np.asarray(feeds, dtype=np.int64)
        batch, steps = len(feeds), int(feeds.max())
        if (feeds == steps).all():  # every row fed alike: the flat layout is the padded one
            out = self.forward_pass(window, np.asarray(tokens, dtype=np.int64).reshape(batch, steps),
                                    logits_at=np.full(batch, steps - 1) if last else None)
            return Forwarded(out.logits.reshape(-1, out.logits.shape[-1]), out.steady)
        real = np.flatnonzero(np.arange(steps)[None, :] < feeds[:, None])  # [N] into [batch * T]
        fed = np.flatnonzero(feeds)  # the rows fed
        if not self.packs:
            ids = np.zeros(batch * steps, dtype=np.int64)
            ids[real] = tokens
            if last:
                out = self.forward_pass(window, ids.reshape(batch, steps), logits_at=np.maximum(feeds - 1, 0))
                return Forwarded(out.logits[torch.as_tensor(fed, device=self.device), 0], out.steady)
            out = self.forward_pass(window, ids.reshape(batch, steps))
            return Forwarded(out.logits.reshape(batch * steps, -1)[torch.as_tensor(real, device=self.device)], out.steady)
        ends = np.cumsum(feeds[fed]) - 1 if last else None  # [fed rows] into [N]
        return self._pass(window, torch.as_tensor(tokens, dtype=torch.int64, device=self.device), steps,
                          real=torch.as_tensor(real, device=self.device),
                          ends=None if ends is None else torch.as_tensor(ends, device=self.device))

    def _pass(self, window: slice, input_ids: torch.Tensor, steps: int, logits_at: np.ndarray | None = None,
              real: torch.Tensor | None = None, ends: torch.Tensor | None = None) -> Forwarded:
        """A pass that is not at a static shape: the rows of `window`, `steps` wide (`OwnForward.__call__`
        for input_ids, real and ends), or the stock model's."""
        host_lengths = self.cache.lengths[window]
        lengths = torch.as_tensor(host_lengths, device=self.device)  # [batch]
        positions = lengths[:, None] + torch.arange(steps, device=self.device)[None, :]  # [batch, T]
        kv_len = max(host_lengths) + steps  # padding may reach past the context limit; it is never committed
        self.cache.prepare(window, positions, kv_len)
        start = time.perf_counter()
        with torch.inference_mode():
            if self._own is not None:
                at = None if logits_at is None else torch.as_tensor(logits_at, dtype=torch.int64, device=self.device)
                logits = self._own(input_ids, positions, self._mask(positions, kv_len), self.cache, at, real, ends)
            else:
                logits = self._stock(input_ids, positions, self._visible(positions, kv_len), logits_at)
        self.forward_seconds += time.perf_counter() - start
        return Forwarded(logits, steady=True)

    def _forward_static(self, window: slice, input_ids, logits_at: np.ndarray | None) -> Forwarded:
        """A batched pass at a static shape: rows padded to the batch bucket (padding rows write only
        past their slot's committed length, so they change nothing), attention over the KV bucket, or,
        where the forward reads each row's length on the device, over the whole cache (one shape per
        batch bucket and width, whatever the rows' lengths)."""
        input_ids = np.asarray(input_ids if not torch.is_tensor(input_ids) else input_ids.cpu(), dtype=np.int64)
        batch, real = input_ids.shape
        static = self.static
        bucket = static.batch_bucket(batch)
        lengths = np.zeros(bucket, dtype=np.int64)
        known = min(bucket, self.cache.rows)
        lengths[:known] = self.cache.lengths[:known]
        steps = self._static_width(real, int(lengths.max()), logits_at)
        kv = self.cache.capacity if self._own.reads_lengths else static.kv_bucket(int(lengths[:batch].max()) + steps)
        assert int(lengths.max()) + steps <= self.cache.capacity, "a static cache never grows"
        key = (bucket, steps, kv, logits_at is None)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape(
                torch.zeros((bucket, steps), dtype=torch.int64, device=self.device),
                torch.zeros(bucket, dtype=torch.int64, device=self.device),
                None if logits_at is None else torch.zeros(bucket, dtype=torch.int64, device=self.device))
        ids = np.zeros((bucket, steps), dtype=np.int64)
        ids[:batch, :real] = input_ids
        shape.input_ids.copy_(torch.from_numpy(ids), non_blocking=True)  # inputs only: no read-back
        shape.lengths.copy_(torch.from_numpy(lengths), non_blocking=True)
        if logits_at is not None:
            at = np.zeros(bucket, dtype=np.int64)
            at[:batch] = logits_at
            shape.logits_at.copy_(torch.from_numpy(at), non_blocking=True)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self._replay(shape, kv)
        self.forward_seconds += time.perf_counter() - start
        return Forwarded(out.logits[:batch], out.steady)

    def _static_width(self, steps: int, longest: int, logits_at: np.ndarray | None) -> int:
        """The width a static pass of `steps` tokens runs at. A prefill pass (logits at one position a
        row) on the batch-invariant kernels runs padded to the narrowest of `prefill_widths` that holds
        it: prompts of any length then share a few captured shapes (`warm_prefill`), and a token's
        logits and entries are the same in any pass. The padding writes past the rows' tokens and is
        never committed; where it would pass the cache's end, the pass runs unpadded. Verify passes,
        and passes on other layers, run at their own width."""
        if logits_at is None:
            return steps
        return next((w for w in self.prefill_widths() if w >= steps and longest + w <= self.cache.capacity), steps)

    def prefill_widths(self) -> list[int]:
        """The widths prefill passes run at here (`_static_width`), narrowest first: powers of two from
        `MIN_PREFILL_WIDTH`, then the chunk; none where passes are not static or not on the invariant kernels."""
        if self.static is None or not self._own.reads_lengths:
            return []
        widths, width = [], MIN_PREFILL_WIDTH
        while width < self.prefill_chunk:
            widths.append(width)
            width *= 2
        return widths + [self.prefill_chunk]

    def warm_prefill(self, row_id: str) -> None:
        """Run each prefill width (`prefill_widths`) in the slot of `row_id` (slot 0: a static pass)
        until its shape runs steady (captured, under CUDA graphs), committing nothing, so that no
        request's prefill pays for a shape's warm-up and capture."""
        window = self.window_of(row_id)
        for width in (w for w in self.prefill_widths() if w <= self.cache.capacity - self.length(row_id)):
            for _ in range(3):  # eager, eager, captured (`_replay`)
                if self.forward_pass(window, np.zeros((1, width), dtype=np.int64), logits_at=np.array([width - 1])).steady:
                    break

    def _replay(self, shape: _Shape, kv: int) -> Forwarded:
        """Run the shape's pass: eagerly without graphs (steady), else eagerly on its first two calls
        (lazy initialisation, autotuning), captured on the third (neither steady) and replayed after."""
        def run() -> torch.Tensor:
            steps = shape.input_ids.shape[1]
            positions = shape.lengths[:, None] + torch.arange(steps, device=self.device)[None, :]  # [bucket, T]
            self.cache.prepare(slice(0, len(shape.lengths)), positions, kv)
            return self._own(shape.input_ids, positions, self._mask(positions, kv), self.cache, shape.logits_at)

        if not (self.static.graphs and self.device.type == "cuda"):
            return Forwarded(run(), steady=True)
        shape.calls += 1
        if shape.graph is None and shape.calls <= 2:  # warm up eagerly (lazy initialisation, autotuning)
            return Forwarded(run(), steady=False)
        steady = shape.graph is not None
        if not steady:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream().wait_stream(side)
            shape.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(shape.graph):
                shape.logits = run()
        shape.graph.replay()
        return Forwarded(shape.logits.clone(), steady)  # a copy: the next replay overwrites the graph's output

    def _visible(self, positions: torch.Tensor, kv: int) -> torch.Tensor:
        """[batch, T, kv] bool: row b's token at position p sees cache entries 0..p (stale entries past a
        row's length are hidden)."""
        return torch.arange(kv, device=self.device)[None, None, :] <= positions[:, :, None]

    def _mask(self, positions: torch.Tensor, kv: int) -> torch.Tensor | None:
        """Our forward's attention mask [batch, 1, T, kv] bool; None where it reads positions itself."""
        return None if self._own.reads_lengths else self._visible(positions, kv)[:, None]

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

    def prefill(self, row_id: str, token_ids: Sequence[int]) -> torch.Tensor:
        """Feed one row `token_ids` in passes that end at chunk boundaries (`PrefillChunks.end`) and commit them;
        return the logits [vocab] after the last one."""
        window = self.window_of(row_id)
        ids = np.asarray(token_ids, dtype=np.int64)
        length, done = self.length(row_id), 0
        while done < len(ids):
            end = self.chunks.end(length + done, length + len(ids)) - length
            piece = ids[done:end][None, :]  # [1, T]
            logits = self.forward(window, piece, logits_at=np.array([piece.shape[1] - 1]))
            self.commit(window, [piece.shape[1]])
            done = end
        return logits[0, -1]
