"""`Verifier`: owns the target model and its per-row KV cache; prefills rows, verifies drafts,
applies acceptance and rolls each row back by length. It never imports a drafter."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specdraft.drafters.base import Draft
from specdraft.params import SamplingParams
from specdraft.sampling import ACCEPT, RESIDUAL, SAMPLE, keyed_uniforms, logits_to_probs
from specdraft.verifier.acceptance import PAD, greedy_accept, rejection_sample
from specdraft.verifier.cache import RowKVCache

PREFILL_CHUNK = 1024


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]  # accepted draft tokens, then the recovered or bonus token
    accepted: int


class InvalidDraftError(ValueError):
    """A drafter proposed something the verifier cannot check (e.g. a token outside the vocabulary)."""

    def __init__(self, row_id: str, message: str) -> None:
        super().__init__(f"request {row_id}: {message}")
        self.row_id = row_id


@dataclass
class _Row:
    params: SamplingParams
    seed: int  # keys the row's random draws (`specdraft.sampling.keyed_uniforms`)


class Verifier:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = RowKVCache.for_model(model)
        self.device = self.cache.device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._rows: dict[str, _Row] = {}
        self._order: list[str] = []  # row id at each cache slot
        self.forward_seconds = 0.0  # time inside model forward passes (host clock)

    # -- row lifecycle -------------------------------------------------------------------
    def add(self, row_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """Prefill a new row with its prompt; return the first generated token."""
        assert row_id not in self._rows, row_id
        assert len(prompt_ids) > 0
        seed = params.seed if params.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self._rows[row_id] = _Row(params, seed)
        slot = self.cache.add_row()
        self._order.append(row_id)
        ids = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=self.device)[None, :]
        for start in range(0, ids.shape[1], PREFILL_CHUNK):
            chunk = ids[:, start : start + PREFILL_CHUNK]
            logits = self._forward(slice(slot, slot + 1), chunk, logits_to_keep=1)  # [1, 1, vocab]
            self.cache.lengths[slot] += chunk.shape[1]
        no_draft = torch.empty((1, 0), dtype=torch.int64, device=self.device)
        tokens, _ = self._accept([row_id], logits, no_draft, [None], np.array([len(prompt_ids)]))
        return int(tokens[0, 0])

    def remove(self, row_id: str) -> None:
        slot = self._order.index(row_id)
        moved = self.cache.remove_row(slot)
        if moved is not None:
            self._order[slot] = self._order[moved]
        self._order.pop()
        del self._rows[row_id]

    def length(self, row_id: str) -> int:
        """Tokens of the row held in the KV cache."""
        return self.cache.lengths[self._order.index(row_id)]

    @property
    def row_ids(self) -> list[str]:
        return list(self._order)

    # -- one step ------------------------------------------------------------------------
    def step(self, last_tokens: dict[str, int], drafts: dict[str, Draft]) -> dict[str, StepResult]:
        """Verify every active row's draft in one forward pass (rows without a draft take one token)."""
        order = self._order
        assert set(last_tokens) == set(order), "every active row takes part in each step"
        for row_id, d in drafts.items():
            self._check_draft(row_id, d)
        k = max((len(drafts[r]) for r in order if r in drafts), default=0)
        draft = np.full((len(order), k), PAD, dtype=np.int64)
        for b, row_id in enumerate(order):
            if row_id in drafts and len(drafts[row_id]):
                draft[b, : len(drafts[row_id])] = drafts[row_id].token_ids
        inputs = np.concatenate([np.array([[last_tokens[r]] for r in order], dtype=np.int64), np.maximum(draft, 0)], 1)
        draft_t = torch.as_tensor(draft, device=self.device)  # [batch, k]
        # Row b's last token sits at position lengths[b]; its logits decide the token after it.
        first_position = np.asarray(self.cache.lengths, dtype=np.int64) + 1  # [batch]
        logits = self._forward(slice(0, len(order)), torch.as_tensor(inputs, device=self.device))  # [batch, k+1, vocab]
        tokens, accepted = self._accept(order, logits, draft_t, [drafts.get(r) for r in order], first_position)
        results = {}
        for b, row_id in enumerate(order):
            n = int(accepted[b])
            self.cache.lengths[b] += 1 + n  # rollback: entries past this are dead
            results[row_id] = StepResult(tokens[b, : n + 1].tolist(), n)
        return results

    def _forward(self, window: slice, input_ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        batch, steps = input_ids.shape
        lengths = torch.as_tensor(self.cache.lengths[window], device=self.device)  # [batch]
        positions = lengths[:, None] + torch.arange(steps, device=self.device)[None, :]  # [batch, T]
        kv_len = max(self.cache.lengths[window]) + steps
        self.cache.prepare(window, positions, kv_len)
        # Row b's token at position t sees cache entries 0..t; stale entries past a row's length are hidden.
        visible = torch.arange(kv_len, device=self.device)[None, None, :] <= positions[:, :, None]  # [batch, T, kv]
        mask = torch.zeros(visible.shape, dtype=self.cache.dtype, device=self.device)
        mask.masked_fill_(~visible, torch.finfo(self.cache.dtype).min)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=mask[:, None],  # [batch, 1, T, kv]
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        self.forward_seconds += time.perf_counter() - start
        return out.logits

    def _check_draft(self, row_id: str, draft: Draft) -> None:
        if not len(draft):
            return
        low, high = int(draft.token_ids.min()), int(draft.token_ids.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidDraftError(row_id, f"draft token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        if draft.probs is not None and tuple(draft.probs.shape) != (len(draft), self.vocab_size):
            raise InvalidDraftError(
                row_id, f"draft probabilities have shape {tuple(draft.probs.shape)}, expected ({len(draft)}, {self.vocab_size})")

    def _accept(self, order: Sequence[str], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None],
                first_position: np.ndarray):
        """Apply each row's acceptance rule; return host arrays tokens [batch, k + 1] and accepted [batch].

        first_position [batch]: the position in its row of the token that logits[b, 0] decides.
        """
        rows = [self._rows[r] for r in order]
        greedy = [b for b, row in enumerate(rows) if row.params.greedy]
        if len(greedy) == len(rows):
            tokens, accepted = greedy_accept(logits, draft)
        else:
            tokens, accepted = self._sample(rows, logits, draft, drafts, first_position)
            if greedy:
                index = torch.as_tensor(greedy, device=self.device)
                g_tokens, g_accepted = greedy_accept(logits[index], draft[index])
                tokens[index], accepted[index] = g_tokens, g_accepted
        # The step's single device-to-host transfer.
        host = torch.cat([tokens, accepted[:, None]], dim=1).cpu().numpy()
        return host[:, :-1], host[:, -1]

    def _sample(self, rows: Sequence[_Row], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None],
                first_position: np.ndarray):
        batch, k = draft.shape
        params = [row.params for row in rows]
        temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=self.device)
        top_k = torch.tensor([p.top_k for p in params], device=self.device) if any(p.top_k for p in params) else None
        top_p = torch.tensor([p.top_p for p in params], device=self.device) if any(p.top_p < 1 for p in params) else None
        p = logits_to_probs(logits, temperature, top_k, top_p)  # [batch, k + 1, vocab]
        q = probabilistic = None
        if any(d is not None and d.probs is not None for d in drafts):
            q = torch.zeros((batch, k, p.shape[-1]), dtype=p.dtype, device=self.device)
            for b, d in enumerate(drafts):
                if d is not None and d.probs is not None:
                    q[b, : len(d)] = d.probs.to(p.dtype)
            flags = [d is not None and d.probs is not None for d in drafts]
            probabilistic = torch.tensor(flags, device=self.device)
        # Each row's draws depend only on its seed and the positions they decide (never on the batch).
        seeds = np.array([row.seed for row in rows], dtype=np.uint64)[:, None]  # [batch, 1]
        positions = first_position[:, None] + np.arange(k + 1)[None, :]  # [batch, k + 1]
        u = np.stack([keyed_uniforms(seeds, positions, s) for s in (SAMPLE, ACCEPT, RESIDUAL)], -1)  # [batch, k + 1, 3]
        u = torch.as_tensor(u.astype(np.float32), device=self.device)
        return rejection_sample(p, draft, u, q, probabilistic)
