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
from specdraft.draft import EMPTY_DRAFT, Draft
from specdraft.grammar import GrammarError, RowGrammar, mask_words, unpack
from specdraft.params import PREFILL_CHUNK, SamplingParams
from specdraft.results import PrefixStats, TokenLogprob
from specdraft.sampling import ACCEPT, RESIDUAL, SAMPLE, distribution, keyed_uniforms, request_seed
from specdraft.verifier.acceptance import PAD, greedy_accept, greedy_accept_host, rejection_sample
from specdraft.verifier.logprobs import pack_logprobs, unpack_logprobs


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]  # accepted draft tokens, then the recovered or bonus token
    accepted: int
    grammar_seconds: float = 0.0  # spent on the row's grammar: its masks and advancing it
    error: str | None = None  # the row's grammar failed (its tokens, if any, are not to be used): the row must end
    # The step's pass ran at its shape's steady cost (`RowModel.forward_pass`): not a static shape's
    # warm-up or capture, whose time is no measure of what the shape costs.
    steady: bool = True
    # One entry per token in `tokens` where the row asked for logprobs (`SamplingParams.logprobs`), else None.
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class _Emitted:
    """What acceptance decided, on the host: tokens [batch, k + 1] (pad -1), accepted [batch], and each
    row's logprobs of its accepted + 1 tokens (None: the row asked for none)."""

    tokens: np.ndarray
    accepted: np.ndarray
    logprobs: list[tuple[TokenLogprob, ...] | None]


@dataclass(frozen=True)
class _Masks:
    """A pass's masks: the constrained rows (batch index, grammar), their masks int32
    [rows, k + 1, words], the seconds spent on each row's grammar and the rows whose grammar failed
    to give a mask (by batch index)."""

    grammars: list[tuple[int, RowGrammar]]
    bits: torch.Tensor
    seconds: list[float]
    errors: dict[int, str]


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
    prefill_chunk: the most prompt tokens a prefill pass takes (`RowModel.chunk_end`: at fixed positions)."""

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
        committed, and a row whose grammar failed in a step committed tokens it never emitted)."""
        if self.prefixes is not None:
            length = self.rows.length(row_id)
            self.rows.store_prefix(row_id, self.prefixes, salt, token_ids[:length])

    def prefix_stats(self) -> PrefixStats | None:
        """A snapshot of the prefix cache's figures (None: it keeps none)."""
        return None if self.prefixes is None else replace(self.prefixes.stats)

    def chunk_end(self, row_id: str, stop: int) -> int:
        """Where the row's next prefill pass ends, feeding at most up to position `stop` (`RowModel.chunk_end`)."""
        return self.rows.chunk_end(self.rows.length(row_id), stop)

    def chunk_cost(self, row_id: str, end: int) -> int:
        """What the row's next prefill pass, to `end`, counts in a step's token budget (`RowModel.chunk_cost`)."""
        return self.rows.chunk_cost(self.rows.length(row_id), end)

    def prefill(self, row_id: str, token_ids: Sequence[int], last: bool) -> StepResult | None:
        """Feed the next part of a row's prompt (in chunks at fixed positions: `chunk_end`). After the last part the row joins the steps and its
        first generated token is returned (a result of one token, or the error of a grammar that failed)."""
        assert len(token_ids) > 0
        masks = self._masks([row_id], [EMPTY_DRAFT], 1) if last else None
        if masks is not None and masks.errors:
            return StepResult([], 0, masks.seconds[0], masks.errors[0])
        logits = self.rows.prefill(row_id, token_ids)  # [vocab]
        if not last:
            return None
        self.rows.activate(row_id)
        no_draft = torch.empty((1, 0), dtype=torch.int64, device=self.device)
        first_position = np.array([self.rows.length(row_id)])
        emitted, seconds, errors = self._decide([row_id], logits[None, None], no_draft, [None], first_position, masks)
        return StepResult([int(emitted.tokens[0, 0])], 0, seconds[0], errors.get(0), logprobs=emitted.logprobs[0])

    def admit(self, row_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """`add` and prefill a whole prompt; return the first generated token."""
        self.add(row_id, params)
        return self.prefill(row_id, prompt_ids, last=True).tokens[0]

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
    def step(self, last_tokens: dict[str, int], drafts: dict[str, Draft]) -> dict[str, StepResult]:
        """Verify the drafts of the rows in `last_tokens` (each row's last token) in one forward pass; a
        row without a draft takes one token. Active rows not in `last_tokens` sit the pass out: they
        are fed nothing and keep their cache as it is. A row whose grammar fails gets its error and
        keeps nothing of the pass. The drafts come checked (`Draft.problem`: the engine's step checks
        each, and fails the row of one the target cannot take)."""
        order = self.rows.active_ids
        assert set(last_tokens) <= set(order), "only active rows take part in a step"
        k = max((len(d) for r, d in drafts.items() if r in last_tokens), default=0)
        masks = self._masks(order, [drafts.get(r, EMPTY_DRAFT) if r in last_tokens else None for r in order], k + 1)
        failed = {} if masks is None else masks.errors
        taking = np.array([r in last_tokens and b not in failed for b, r in enumerate(order)], dtype=bool)  # [batch]
        if not taking.any():  # every row that was to take part failed: no pass
            return {r: StepResult([], 0, masks.seconds[b], failed[b]) for b, r in enumerate(order) if r in last_tokens}
        draft = np.full((len(order), k), PAD, dtype=np.int64)  # [batch, k]
        for b, row_id in enumerate(order):
            if taking[b] and row_id in drafts and len(drafts[row_id]):
                draft[b, : len(drafts[row_id])] = drafts[row_id].token_ids
        inputs = np.concatenate([np.array([[last_tokens.get(r, 0)] for r in order], dtype=np.int64),
                                 np.maximum(draft, 0)], 1)
        window = self.rows.active_window
        # Row b's last token sits at position lengths[b]; its logits decide the token after it.
        first_position = np.asarray(self.rows.lengths(window), dtype=np.int64) + 1  # [batch]
        counts = [(1 + len(drafts.get(r, EMPTY_DRAFT))) * int(taking[b]) for b, r in enumerate(order)]
        forwarded = self.rows.forward_pass(window, inputs, counts=counts)
        logits = forwarded.logits  # [batch, k + 1, vocab]; zeros past a row's tokens
        draft_t = torch.as_tensor(draft, device=self.device)
        kept = [drafts.get(r) if taking[b] else None for b, r in enumerate(order)]
        emitted, grammar_seconds, errors = self._decide(order, logits, draft_t, kept, first_position, masks)
        tokens, accepted = emitted.tokens, emitted.accepted
        # A row keeps its last token and its accepted draft (the rest is rolled back); a row sitting out, nothing.
        self.rows.commit(window, np.where(taking, accepted + 1, 0))
        errors = {**failed, **errors}
        return {row_id: StepResult([] if b in errors else tokens[b, : int(accepted[b]) + 1].tolist(),
                                   0 if b in errors else int(accepted[b]), grammar_seconds[b], errors.get(b),
                                   forwarded.steady, None if b in errors else emitted.logprobs[b])
                for b, row_id in enumerate(order) if row_id in last_tokens}

    def _masks(self, order: Sequence[str], drafts: Sequence[Draft | None], width: int) -> _Masks | None:
        """The constrained rows' masks for a pass deciding `width` positions per row (before the pass:
        a grammar that fails ends its row before any work is done for it). drafts[b] None: row b sits
        the pass out."""
        grammars = [(b, self._params[r].grammar) for b, r in enumerate(order)
                    if self._params[r].grammar is not None and drafts[b] is not None]
        if not grammars:
            return None
        seconds, errors = [0.0] * len(order), {}
        bits = torch.full((len(grammars), width, mask_words(self.vocab_size)), -1, dtype=torch.int32)  # [rows, k + 1, words]
        for i, (b, grammar) in enumerate(grammars):
            start = time.perf_counter()
            try:
                grammar.masks(drafts[b].token_ids, bits[i])
            except GrammarError as exc:
                errors[b] = str(exc)
            seconds[b] += time.perf_counter() - start
        kept = [i for i, (b, _) in enumerate(grammars) if b not in errors]
        return _Masks([grammars[i] for i in kept], bits[kept], seconds, errors)

    def _decide(self, order: Sequence[str], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None],
                first_position: np.ndarray, masks: _Masks | None):
        """Mask the constrained rows' logits, apply each row's acceptance rule, and advance the
        constrained rows' grammars by what they emit. Returns what was emitted (`_Emitted`), the
        seconds each row's grammar took, and the rows whose grammar failed to advance (batch index -> why)."""
        if masks is None or not masks.grammars:
            seconds = [0.0] * len(order) if masks is None else masks.seconds
            return self._accept(order, logits, draft, drafts, first_position, logits), seconds, {}
        # Tokens a row's grammar forbids get -inf before temperature, top-k and top-p (which then see
        # legal tokens only). A copy: the forward's output buffer is the model's to reuse.
        index = torch.tensor([b for b, _ in masks.grammars], device=logits.device)
        allowed = unpack(masks.bits.to(logits.device), self.vocab_size)  # [rows, k + 1, vocab]
        masked = logits.clone()
        masked[index] = logits[index].masked_fill(~allowed, float("-inf"))
        emitted = self._accept(order, masked, draft, drafts, first_position, logits)
        errors: dict[int, str] = {}
        for b, grammar in masks.grammars:
            start = time.perf_counter()
            try:
                grammar.advance(emitted.tokens[b, : int(emitted.accepted[b]) + 1])  # legal: chosen under the mask
            except GrammarError as exc:  # a resource limit of the grammar library: that row ends
                errors[b] = str(exc)
            masks.seconds[b] += time.perf_counter() - start
        return emitted, masks.seconds, errors

    def _accept(self, order: Sequence[str], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None],
                first_position: np.ndarray, raw: torch.Tensor) -> _Emitted:
        """Apply each row's acceptance rule to `logits` and gather the logprobs of the rows that ask for
        them from `raw` (the logits before any grammar mask); bring both to the host.

        first_position [batch]: the position in its row of the token that logits[b, 0] decides.
        """
        rows = [self._params[r] for r in order]
        greedy = [b for b, row in enumerate(rows) if row.params.greedy]
        asking = [b for b, row in enumerate(rows) if row.params.logprobs is not None]
        if len(greedy) == len(rows) and not asking and logits.device.type == "cpu" and logits.dtype == torch.float32:
            tokens, accepted = greedy_accept_host(logits.detach().numpy(), draft.numpy())  # already on the host
            return _Emitted(tokens, accepted, [None] * len(rows))
        if len(greedy) == len(rows):
            tokens, accepted = greedy_accept(logits, draft)
        else:
            tokens, accepted = self._sample(rows, logits, draft, drafts, first_position)
            if greedy:
                index = torch.as_tensor(greedy, device=self.device)
                g_tokens, g_accepted = greedy_accept(logits[index], draft[index])
                tokens[index], accepted[index] = g_tokens, g_accepted
        parts = [tokens, accepted[:, None]]  # int64 [batch, k + 1], [batch, 1]
        if asking:
            index = torch.as_tensor(asking, device=self.device)
            top = max(rows[b].params.logprobs for b in asking)
            parts.append(pack_logprobs(raw[index], tokens[index], top))  # [asking, k + 1, 1 + 2 top]
        # The step's single device-to-host transfer.
        host = torch.cat([part.flatten() for part in parts]).cpu().numpy()
        batch, width = tokens.shape
        host_tokens = host[: batch * width].reshape(batch, width)
        host_accepted = host[batch * width : batch * (width + 1)]
        logprobs: list[tuple[TokenLogprob, ...] | None] = [None] * batch
        if asking:
            packed = host[batch * (width + 1) :].reshape(len(asking), width, -1)  # [asking, k + 1, 1 + 2 top]
            entries = unpack_logprobs(packed, host_tokens[asking], host_accepted[asking] + 1,
                                      [rows[b].params.logprobs for b in asking])
            for b, row_entries in zip(asking, entries):
                logprobs[b] = tuple(row_entries)
        return _Emitted(host_tokens, host_accepted, logprobs)

    def _sample(self, rows: Sequence[_Row], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None],
                first_position: np.ndarray):
        batch, k = draft.shape
        p = distribution(logits, [row.params for row in rows])  # [batch, k + 1, vocab]
        # A seeded row treats every draft as deterministic: its output is then plain sampling's with
        # that seed whatever was drafted (a probabilistic drafter draws seeded rows' tokens with the
        # same keyed uniforms, which keeps acceptance high). So does a constrained row: its drafts were
        # cut at their first illegal token, and the cut depends on the token drawn there, so testing
        # the kept tokens against q would bias the output; as deterministic drafts the output is the
        # target's own draw at every position whatever was drafted. Other rows use their drafts' q.
        with_q = [d is not None and d.probs is not None and row.params.seed is None and row.grammar is None
                  for d, row in zip(drafts, rows)]
        q = probabilistic = None
        if any(with_q):
            q = torch.zeros((batch, k, p.shape[-1]), dtype=p.dtype, device=self.device)
            for b, d in enumerate(drafts):
                if with_q[b]:
                    q[b, : len(d)] = d.probs.to(device=self.device, dtype=p.dtype)
            probabilistic = torch.tensor(with_q, device=self.device)
        # Each row's draws depend only on its seed and the positions they decide (never on the batch).
        seeds = np.array([row.seed for row in rows], dtype=np.uint64)[:, None]  # [batch, 1]
        positions = first_position[:, None] + np.arange(k + 1)[None, :]  # [batch, k + 1]
        u = np.stack([keyed_uniforms(seeds, positions, s) for s in (SAMPLE, ACCEPT, RESIDUAL)], -1)  # [batch, k + 1, 3]
        u = torch.as_tensor(u.astype(np.float32), device=self.device)
        return rejection_sample(p, draft, u, q, probabilistic)
