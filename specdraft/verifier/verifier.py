"""`Verifier`: owns the target model and its per-row KV cache; prefills rows, verifies drafts,
applies acceptance and rolls each row back by length. It never imports a drafter."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from specdraft.drafters.base import Draft
from specdraft.sampling import SamplingParams, logits_to_probs
from specdraft.verifier.acceptance import PAD, greedy_accept, rejection_sample
from specdraft.verifier.cache import RowKVCache

PREFILL_CHUNK = 1024


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]  # accepted draft tokens, then the recovered or bonus token
    accepted: int


@dataclass
class _Row:
    params: SamplingParams
    generator: torch.Generator | None


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
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed if params.seed is not None else int(np.random.SeedSequence().entropy % 2**63))
        self._rows[row_id] = _Row(params, generator)
        slot = self.cache.add_row()
        self._order.append(row_id)
        ids = torch.as_tensor(np.asarray(prompt_ids, dtype=np.int64), device=self.device)[None, :]
        for start in range(0, ids.shape[1], PREFILL_CHUNK):
            chunk = ids[:, start : start + PREFILL_CHUNK]
            logits = self._forward(slice(slot, slot + 1), chunk, logits_to_keep=1)  # [1, 1, vocab]
            self.cache.lengths[slot] += chunk.shape[1]
        tokens, _ = self._accept([row_id], logits, torch.empty((1, 0), dtype=torch.int64, device=self.device), [None])
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
        k = max((len(drafts[r]) for r in order if r in drafts), default=0)
        draft = np.full((len(order), k), PAD, dtype=np.int64)
        for b, row_id in enumerate(order):
            if row_id in drafts and len(drafts[row_id]):
                draft[b, : len(drafts[row_id])] = drafts[row_id].token_ids
        inputs = np.concatenate([np.array([[last_tokens[r]] for r in order], dtype=np.int64), np.maximum(draft, 0)], 1)
        draft_t = torch.as_tensor(draft, device=self.device)  # [batch, k]
        logits = self._forward(slice(0, len(order)), torch.as_tensor(inputs, device=self.device))  # [batch, k+1, vocab]
        tokens, accepted = self._accept(order, logits, draft_t, [drafts.get(r) for r in order])
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

    def _accept(self, order: Sequence[str], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None]):
        """Apply each row's acceptance rule; return host arrays tokens [batch, k + 1] and accepted [batch]."""
        rows = [self._rows[r] for r in order]
        greedy = [b for b, row in enumerate(rows) if row.params.greedy]
        if len(greedy) == len(rows):
            tokens, accepted = greedy_accept(logits, draft)
        else:
            tokens, accepted = self._sample(rows, logits, draft, drafts)
            if greedy:
                index = torch.as_tensor(greedy, device=self.device)
                g_tokens, g_accepted = greedy_accept(logits[index], draft[index])
                tokens[index], accepted[index] = g_tokens, g_accepted
        # The step's single device-to-host transfer.
        host = torch.cat([tokens, accepted[:, None]], dim=1).cpu().numpy()
        return host[:, :-1], host[:, -1]

    def _sample(self, rows: Sequence[_Row], logits: torch.Tensor, draft: torch.Tensor, drafts: Sequence[Draft | None]):
        batch, k = draft.shape
        params = [row.params for row in rows]
        temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=self.device)
        top_k = torch.tensor([p.top_k for p in params], device=self.device) if any(p.top_k for p in params) else None
        top_p = torch.tensor([p.top_p for p in params], device=self.device) if any(p.top_p < 1 for p in params) else None
        p = logits_to_probs(logits, temperature, top_k, top_p)  # [batch, k + 1, vocab]
        q = None
        if any(d is not None and d.probs is not None for d in drafts):
            q = torch.zeros((batch, k, p.shape[-1]), dtype=p.dtype, device=self.device)
            for b, d in enumerate(drafts):
                if d is None or not len(d):
                    continue
                if d.probs is not None:
                    q[b, : len(d)] = d.probs.to(p.dtype)
                else:
                    q[b, torch.arange(len(d)), torch.as_tensor(d.token_ids, device=self.device)] = 1.0
        uniform = torch.empty((batch, k), device=self.device)
        exponential = torch.empty((batch, p.shape[-1]), device=self.device)
        for b, row in enumerate(rows):
            generator = row.generator
            if generator is None:  # greedy rows are overwritten by the caller; any draw will do
                uniform[b].fill_(0.5)
                exponential[b].fill_(1.0)
                continue
            uniform[b].uniform_(generator=generator)
            exponential[b].exponential_(generator=generator)
        return rejection_sample(p, draft, q, uniform, exponential)
