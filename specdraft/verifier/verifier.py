"""`Verifier`: owns the target as a `RowModel`; prefills rows, verifies drafts, applies acceptance
and rolls each row back by length. It never imports a drafter."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from specdraft.backend import RowModel, StaticShapes
from specdraft.backend.prefix import PrefixCache
from specdraft.grammar import GrammarError, RowGrammar, mask_words, unpack
from specdraft.params import PREFILL_CHUNK, SamplingParams
from specdraft.results import PrefixStats, TokenLogprob
from specdraft.sampling import ACCEPT, RESIDUAL, SAMPLE, distribution, keyed_uniforms, request_seed
from specdraft.verifier.acceptance import greedy_accept, greedy_accept_host, rejection_sample
from specdraft.verifier.batch import Batch, Verdict, offsets_of
from specdraft.verifier.logprobs import pack_logprobs, unpack_logprobs


@dataclass(frozen=True)
class _Masks:
    """A pass's masks: the constrained rows whose grammar gave one (row, grammar), the flat positions
    of theirs the pass decides [M] and their masks int32 [M, words]; the seconds spent on each row's
    grammar [rows], and why a row's grammar failed to give a mask (None: it did not)."""

    grammars: list[tuple[int, RowGrammar]]
    positions: np.ndarray
    bits: torch.Tensor
    seconds: np.ndarray
    errors: tuple[str | None, ...]


@dataclass
class _Row:
    params: SamplingParams
    seed: int  # keys the row's random draws (`specdraft.sampling.keyed_uniforms`)
    grammar: RowGrammar | None = None  # constrains the row's tokens (structured output)


class Verifier:
    """model: the target; static: run steps at static shapes (`StaticShapes`, CUDA graphs on CUDA);
    compiled: on CPU, compiled decode and verify passes (`RowModel`); prefix_cache_bytes: keep rows'
    committed keys and values up to this many bytes for later prompts that start alike
    (`specdraft.backend.prefix`; 0: keep none); kernels: which kernels run the target's forward
    (`specdraft.backend.forward.OwnForward`: "auto" runs the batch-invariant Triton kernels on CUDA);
    prefill_chunk: the most prompt tokens a prefill pass takes (`RowModel.chunks`: at fixed positions)."""

    def __init__(self, model: torch.nn.Module, static: StaticShapes | None = None, compiled: bool = False,
                 prefix_cache_bytes: int = 0, kernels: str = "auto", prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.rows = RowModel(model, static=static, compiled=compiled, kernels=kernels, prefill_chunk=prefill_chunk)
        self.device = self.rows.device
        self.vocab_size = self.rows.vocab_size
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._params: dict[str, _Row] = {}

    # -- row lifecycle -------------------------------------------------------------------
    def add(self, row_id: str, params: SamplingParams, grammar: RowGrammar | None = None) -> None:
        """A new row, waiting to be prefilled (it takes no part in steps until its prefill ends).
        grammar: the row's grammar state (`specdraft.grammar`); its tokens are then chosen among the
        legal ones only, and the verifier advances it by every token the row emits."""
        self._params[row_id] = _Row(params, request_seed(params), grammar)
        self.rows.add(row_id)

    def read_prefix(self, row_id: str, salt: str | None, prompt_ids: Sequence[int]) -> int:
        """Start a new row with the stored entries of the longest prefix of its prompt that an earlier
        row with the same salt committed (all of the prompt but its last token at most: that one's
        logits give the first token); return how many tokens it took. Its prefill goes on from there."""
        if self.prefixes is None:
            return 0
        return self.rows.read_prefix(row_id, self.prefixes, salt, prompt_ids, len(prompt_ids) - 1)

    def store_prefix(self, row_id: str, salt: str | None, token_ids: Sequence[int]) -> None:
        """Store the row's committed entries for later rows with the same salt; token_ids: the row's
        tokens (its first min(committed, given) positions are stored: the last emitted token is never
        committed)."""
        if self.prefixes is not None:
            length = self.rows.length(row_id)
            self.rows.store_prefix(row_id, self.prefixes, salt, token_ids[:length])

    def prefix_stats(self) -> PrefixStats | None:
        """A snapshot of the prefix cache's figures (None: it keeps none)."""
        return None if self.prefixes is None else replace(self.prefixes.stats)

    def chunk_end(self, row_id: str, stop: int) -> int:
        """Where the row's next prefill pass ends, feeding at most up to position `stop` (`PrefillChunks.end`)."""
        return self.rows.chunks.end(self.rows.length(row_id), stop)

    def chunk_cost(self, row_id: str, end: int) -> int:
        """What the row's next prefill pass, to `end`, counts in a step's token budget (`PrefillChunks.cost`)."""
        return self.rows.chunks.cost(self.rows.length(row_id), end)

    def prefill(self, row_id: str, token_ids: Sequence[int], last: bool) -> Verdict | None:
        """Feed the next part of a row's prompt (in chunks at fixed positions: `chunk_end`). After the
        last part the row joins the steps, and the verdict of a one-row batch without a draft gives its
        first generated token (or the error of a grammar that failed)."""
        assert len(token_ids) > 0
        batch = Batch.of([row_id], [int(token_ids[-1])], [None]) if last else None
        masks = self._masks(batch) if last else None
        if masks is not None and masks.errors[0] is not None:
            return Verdict.failed(masks.errors, masks.seconds)
        logits = self.rows.prefill(row_id, token_ids)  # [vocab]
        if not last:
            return None
        self.rows.activate(row_id)
        return self._decide(batch, logits[None], np.array([self.rows.length(row_id)]), masks)

    def admit(self, row_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """`add` and prefill a whole prompt; return the first generated token."""
        self.add(row_id, params)
        return self.prefill(row_id, prompt_ids, last=True).emitted(0)[0]

    def remove(self, row_id: str) -> None:
        self.rows.remove(row_id)
        del self._params[row_id]

    def truncate(self, row_id: str, length: int) -> None:
        """Roll a row back to its first `length` cached tokens."""
        self.rows.truncate(row_id, length)

    def warm_prefill(self, row_id: str) -> None:
        """Warm up (capture) every width a prefill pass runs at, in this row's slot (`RowModel.warm_prefill`)."""
        self.rows.warm_prefill(row_id)

    def length(self, row_id: str) -> int:
        """Tokens of the row held in the KV cache."""
        return self.rows.length(row_id)

    @property
    def row_ids(self) -> list[str]:
        """The rows that take part in steps, in batch order."""
        return self.rows.active_ids

    @property
    def static(self) -> bool:
        """Whether steps run at static shapes (`StaticShapes`): a shape's first passes warm it up (and capture it)."""
        return self.rows.static is not None

    @property
    def packs(self) -> bool:
        """Whether a step costs its real tokens (rows' drafts unpadded), not batch x the longest."""
        return self.rows.packs

    @property
    def compiled_tokens(self) -> int:
        """The longest pass the compiled step runs (0: none; a longer pass runs slower layers)."""
        return self.rows.compiled_tokens

    @property
    def forward_seconds(self) -> float:
        return self.rows.forward_seconds

    # -- one step ------------------------------------------------------------------------
    def step(self, batch: Batch) -> Verdict:
        """Verify the drafts of the batch's rows (`Batch`: active rows, in the verifier's order) in one
        forward pass; a row without a draft takes one token. Active rows not in the batch sit the pass
        out: they are fed nothing and keep their cache as it is. A row whose grammar fails gets its
        error and keeps nothing of the pass. The drafts come checked (`Draft.problem`: the engine's step
        checks each, and fails the row of one the target cannot take)."""
        assert len(batch), "a pass needs a row"
        window = self.rows.active_window
        assert window.start == 0, "the active rows fill the first slots"
        slots = np.array([self.rows.slot(row_id) for row_id in batch.ids], dtype=np.int64)
        assert slots[-1] < window.stop and (np.diff(slots) > 0).all(), "active rows, in the verifier's order"
        masks = self._masks(batch)
        if masks is not None and all(error is not None for error in masks.errors):  # no row left: no pass
            return Verdict.failed(masks.errors, masks.seconds)
        # A row whose grammar failed before the pass rides in it, and keeps nothing of it.
        feeds = np.zeros(window.stop, dtype=np.int64)
        feeds[slots] = batch.feeds
        # Row r's last token sits at position lengths[r]; its logits decide the token after it.
        first_position = np.asarray(self.rows.lengths(window), dtype=np.int64)[slots] + 1  # [rows]
        forwarded = self.rows.packed_pass(window, batch.tokens, feeds)  # logits [N, vocab]
        verdict = self._decide(batch, forwarded.logits, first_position, masks, forwarded.steady)
        # A row keeps its last token and its accepted draft (the rest is rolled back); a row sitting out, nothing.
        kept = np.zeros(window.stop, dtype=np.int64)
        kept[slots] = [0 if error is not None else accepted + 1 for error, accepted in zip(verdict.errors, verdict.accepted)]
        self.rows.commit(window, kept)
        return verdict

    def _masks(self, batch: Batch) -> _Masks | None:
        """The constrained rows' masks at every position of theirs the pass decides (before the pass:
        a grammar that fails ends its row before any of its tokens are decided)."""
        grammars = [(r, self._params[row_id].grammar) for r, row_id in enumerate(batch.ids)
                    if self._params[row_id].grammar is not None]
        if not grammars:
            return None
        seconds, errors = np.zeros(len(batch)), [None] * len(batch)
        spans = [(int(batch.offsets[r]), int(batch.offsets[r + 1])) for r, _ in grammars]
        positions = np.concatenate([np.arange(start, end) for start, end in spans])
        bits = torch.full((len(positions), mask_words(self.vocab_size)), -1, dtype=torch.int32)  # [positions, words]
        at = 0
        for (r, grammar), (start, end) in zip(grammars, spans):
            began = time.perf_counter()
            try:
                grammar.masks(batch.draft(r), bits[at : at + end - start])
            except GrammarError as exc:
                errors[r] = str(exc)
            seconds[r] += time.perf_counter() - began
            at += end - start
        kept = np.concatenate([np.full(end - start, errors[r] is None) for (r, _), (start, end) in zip(grammars, spans)])
        return _Masks([(r, g) for r, g in grammars if errors[r] is None], positions[kept], bits[torch.from_numpy(kept)],
                      seconds, tuple(errors))

    def _decide(self, batch: Batch, logits: torch.Tensor, first_position: np.ndarray, masks: _Masks | None,
                steady: bool = True) -> Verdict:
        """Mask the constrained rows' logits, apply each row's acceptance rule, and advance the
        constrained rows' grammars by what they emit (a grammar that fails to advance ends its row).

        logits [N, vocab] in the batch's layout; first_position [rows]: the position in its row of the
        token that row r's first logits decide."""
        seconds = np.zeros(len(batch)) if masks is None else masks.seconds
        errors = [None] * len(batch) if masks is None else list(masks.errors)
        if masks is None or not masks.grammars:
            tokens, accepted, logprobs = self._accept(batch, logits, first_position, logits)
        else:
            # Tokens a row's grammar forbids get -inf before temperature, top-k and top-p (which then see
            # legal tokens only). A copy: the forward's output buffer is the model's to reuse.
            index = torch.as_tensor(masks.positions, device=logits.device)
            allowed = unpack(masks.bits.to(logits.device), self.vocab_size)  # [positions, vocab]
            masked = logits.clone()
            masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
            tokens, accepted, logprobs = self._accept(batch, masked, first_position, logits)
            for r, grammar in masks.grammars:
                began, start = time.perf_counter(), int(batch.offsets[r])
                try:
                    grammar.advance(tokens[start : start + int(accepted[r]) + 1])  # legal: chosen under the mask
                except GrammarError as exc:  # a resource limit of the grammar library: that row ends
                    errors[r] = str(exc)
                seconds[r] += time.perf_counter() - began
        failed = np.array([error is not None for error in errors])
        return Verdict(tokens, np.where(failed, 0, accepted), batch.offsets, tuple(errors), seconds,
                       tuple(None if failed[r] else entries for r, entries in enumerate(logprobs)), steady)

    def _accept(self, batch: Batch, logits: torch.Tensor, first_position: np.ndarray, raw: torch.Tensor):
        """Apply each row's acceptance rule to `logits` and gather the logprobs of the rows that ask for
        them from `raw` (the logits before any grammar mask); bring both to the host. Returns tokens [N],
        accepted [rows] (`acceptance`) and each row's logprobs of its emitted tokens (None: it asked for none)."""
        rows = [self._params[row_id] for row_id in batch.ids]
        greedy = np.array([row.params.greedy for row in rows])
        asking = [r for r, row in enumerate(rows) if row.params.logprobs is not None]
        if greedy.all() and not asking and logits.device.type == "cpu" and logits.dtype == torch.float32:
            tokens, accepted = greedy_accept_host(logits.detach().numpy(), batch.following, batch.offsets)
            return tokens, accepted, (None,) * len(rows)
        device = logits.device
        following = torch.as_tensor(batch.following, device=device)
        row_of, starts = (torch.as_tensor(a, device=device) for a in (batch.row_of, batch.offsets[:-1]))
        if greedy.all():
            tokens, accepted = greedy_accept(logits, following, row_of, starts)
        else:
            tokens, accepted = self._sample(batch, rows, logits, following, row_of, starts, first_position)
        if greedy.any() and not greedy.all():  # the greedy rows' own rule
            greedy_tokens, greedy_accepted = greedy_accept(logits, following, row_of, starts)
            by_row = torch.as_tensor(greedy, device=device)
            tokens = torch.where(by_row[row_of], greedy_tokens, tokens)
            accepted = torch.where(by_row, greedy_accepted, accepted)
        parts = [tokens, accepted]  # int64 [N], [rows]
        if asking:
            spans = [np.arange(batch.offsets[r], batch.offsets[r + 1]) for r in asking]
            index = torch.as_tensor(np.concatenate(spans), device=device)
            top = max(rows[r].params.logprobs for r in asking)
            parts.append(pack_logprobs(raw[index], tokens[index], top).flatten())  # [positions * (1 + 2 top)]
        # The step's single device-to-host transfer.
        host = torch.cat([part.to(torch.int64) for part in parts]).cpu().numpy()
        n, rows_count = len(batch.tokens), len(rows)
        host_tokens, host_accepted = host[:n], host[n : n + rows_count]
        logprobs: list[tuple[TokenLogprob, ...] | None] = [None] * rows_count
        if asking:
            asked_offsets = offsets_of(batch.feeds[asking])
            entries = unpack_logprobs(host[n + rows_count :].reshape(int(asked_offsets[-1]), -1),
                                      np.concatenate([host_tokens[s] for s in spans]), asked_offsets,
                                      host_accepted[asking] + 1, [rows[r].params.logprobs for r in asking])
            for r, row_entries in zip(asking, entries):
                logprobs[r] = tuple(row_entries)
        return host_tokens, host_accepted, tuple(logprobs)

    def _sample(self, batch: Batch, rows: Sequence[_Row], logits: torch.Tensor, following: torch.Tensor,
                row_of: torch.Tensor, starts: torch.Tensor, first_position: np.ndarray):
        """`rejection_sample` over the batch (every row; the caller keeps the sampled rows' part)."""
        p = distribution(logits[:, None], [rows[r].params for r in batch.row_of.tolist()])[:, 0]  # [N, vocab]
        # A seeded row treats every draft as deterministic: its output is then plain sampling's with
        # that seed whatever was drafted (a probabilistic drafter draws seeded rows' tokens with the
        # same keyed uniforms, which keeps acceptance high). So does a constrained row: its drafts were
        # cut at their first illegal token, and the cut depends on the token drawn there, so testing
        # the kept tokens against q would bias the output; as deterministic drafts the output is the
        # target's own draw at every position whatever was drafted. Other rows use their drafts' q.
        with_q = np.array([q is not None and row.params.seed is None and row.grammar is None
                           for q, row in zip(batch.probs, rows)])
        q = probabilistic = None
        if with_q.any():
            q = torch.zeros_like(p)  # zeros at each row's last position: it tests no draft token
            for r in np.flatnonzero(with_q):
                start = int(batch.offsets[r])
                q[start : start + int(batch.counts[r])] = batch.probs[r].to(device=p.device, dtype=p.dtype)
            probabilistic = torch.as_tensor(with_q[batch.row_of], device=p.device)
        # Each row's draws depend only on its seed and the positions they decide (never on the batch).
        seeds = np.array([row.seed for row in rows], dtype=np.uint64)[batch.row_of]  # [N]
        positions = first_position[batch.row_of] + np.arange(len(batch.tokens)) - batch.offsets[batch.row_of]  # [N]
        u = np.stack([keyed_uniforms(seeds, positions, s) for s in (SAMPLE, ACCEPT, RESIDUAL)], -1)  # [N, 3]
        u = torch.as_tensor(u.astype(np.float32), device=p.device)
        return rejection_sample(p, following, u, row_of, starts, q, probabilistic)
