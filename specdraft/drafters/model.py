"""The `model` drafter: a small causal LM that shares the target's vocabulary proposes the next tokens,
with their probabilities q (Leviathan et al. 2023).

Pairs: any transformers causal LM with the target's vocabulary (`--draft-model`: a hub id in the
local cache, a directory or a .gguf; e.g. Llama-3.2-1B-Instruct drafting for Llama-3.2-3B-Instruct),
planned and loaded by the runtime as the target is (`Settings.resolve`, `specdraft.models.load_draft`)
and checked there (`check_draft_pair`). Without one, an int8 copy of the target (`self-int8`).

Per request the drafter keeps its own KV-cache row (`RowModel`) in step with the target's context:
- a propose call runs one pass that feeds every row its *pending* tokens (those that joined the
  context since its cache last matched it: the target's recovered or bonus token, and the last draft
  token when all were accepted), then one pass per further draft position, for all rows at once;
- `accept` rolls the row back to the accepted part of what it fed, so nothing is ever re-run but the
  pending tokens; a row far behind (a new prompt, or many steps without drafting) catches up in
  chunks of its own before it drafts again. A draft that is a copy of the target (`self-int8`)
  instead copies the target's keys and values for what it lacks (the engine shares the target's
  rows: `SharesTargetCache`): a new prompt or a stretch without drafting costs a copy, not passes.
- a row further behind than its `window` catches up on the context's last `window` tokens only,
  after what it holds already (at least the context's first SINK tokens): the draft model then sees
  the context with a gap, its start and its latest part, as StreamingLLM's windows keep attention
  sinks and recent tokens. Its drafts are only proposals; the verifier decides, so the output is
  unchanged. A long prompt (an agent's whole history) then costs the draft model `window` tokens
  of catching up, not thousands, and the prefix cache keeps such a row as the tokens it holds, so
  the next turn of that conversation reads it and catches up on its new tokens only.
Each draft token comes from q = the draft's distribution after the request's temperature / top-k /
top-p (the transforms the verifier applies to p): greedy requests draft argmax (no q); unseeded
sampled requests draw from q and return it (full rejection sampling); seeded ones draw with the
request's keyed uniforms and return no q (the verifier's coupled test keeps their output exactly
plain sampling's with that seed, whatever the batch). With a draft vocabulary (`vocabulary`) q is the
draft's distribution over the ids below it and those the request's context holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from specdraft.backend import RowModel, StaticShapes, worth_compiling
from specdraft.backend.prefix import PrefixCache
from specdraft.drafters.base import EMPTY_DRAFT, CatchUp, CostlyDrafts, Draft, Parts, Resources
from specdraft.drafters.registry import register
from specdraft.params import SamplingParams, check_cache_mb
from specdraft.sampling import DRAFT, SAMPLE, argmax, distribution, inverse_cdf, keyed_uniforms, request_seed


@dataclass
class _Request:
    params: SamplingParams
    seed: int
    stream: int  # SAMPLE for seeded requests (coupled with the verifier's draws), else DRAFT
    context: list[int]
    draft: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    fed_from: int = 0  # cache length before the draft's tokens were fed
    fed: int = 0  # draft tokens fed to the cache (all but the last)
    # The row's layout: its first `kept` entries are the context's first `kept` tokens, its later ones
    # the context's from `kept + skipped` on (skipped 0: the row holds the context as it is).
    kept: int = 0
    skipped: int = 0
    rare: set[int] = field(default_factory=set)  # the context's ids outside a draft vocabulary, which it drafts too
    rare_ids: torch.Tensor | None = None  # `rare`, sorted (None while it is empty)

    def held(self, start: int, end: int) -> list[int]:
        """The tokens of the row's positions [start, end), as its layout maps them onto the context."""
        return _held(self.context, self.kept, self.skipped, start, end)

    @property
    def length(self) -> int:
        """The context's length as the row's positions count it (the skipped tokens left out)."""
        return len(self.context) - self.skipped


def _held(context: list[int], kept: int, skipped: int, start: int, end: int) -> list[int]:
    """Positions [start, end) of a row whose first `kept` entries are the context's first `kept`
    tokens and whose later ones are the context's from `kept + skipped` on."""
    if not skipped:
        return context[start:end]
    head = context[start : min(end, kept)] if start < kept else []
    tail = max(start, kept)
    return head + context[tail + skipped : end + skipped] if end > tail else head


SINK = 4  # the context's first tokens a row with a gap keeps at least (attention sinks)
WINDOW = 512  # the `model` drafter's default window (`ModelDrafter`'s)
DRAFT_VOCABULARY = 32768  # the draft vocabulary "auto" takes where it takes one
LAYOUTS = 1024  # cache salts whose last row with a gap the drafter remembers (the oldest forgotten)


class ModelDrafter:
    """model: the draft causal LM (eval mode, on the target's device); k: the longest draft;
    eos_token_ids: a draft ends after one; layers, dtype, static, compiled: see `RowModel`.

    One costly part (`specdraft.drafters.base.Parts`): each draft position is a forward pass, so the
    engine asks it after the step's lengths are chosen, and it returns the time of one drafting pass
    without catching up (a propose call's whole time also holds the catch-up on tokens it sat out,
    which a policy that drafts every step does not pay again) and the catch-up apart."""

    def __init__(self, model: torch.nn.Module, k: int, eos_token_ids: Sequence[int] = (),
                 layers: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 static: StaticShapes | None = None, compiled: bool = False, target_copy: bool = False,
                 vocabulary: int | str | None = None, prefix_cache_bytes: int = 0, window: int | None = None) -> None:
        """target_copy: `model` is built from the target's own layers (`LoadedModel.target_copy`), so
        it may take the target's keys and values (`share_target`). vocabulary: draft among the ids
        below it only (a multiple of 16; None: every id; "auto": DRAFT_VOCABULARY where the compiled
        CPU step runs a draft model of at least twice as many, else every id), and beside them the ids
        the request's context holds (the names and keys a reply copies from its prompt, often rare
        ids), their q renormalised over them: where the compiled CPU step runs the draft, its output
        layer's other rows are never read (`NumbaLayers.keep_vocabulary`, `also_rows`). Byte-pair
        vocabularies number their tokens roughly by how often they merge, so the first ids are the
        common ones (as FR-Spec's frequency-ranked draft vocabularies); the verifier is unchanged, so
        the output is too. prefix_cache_bytes: keep ended requests' keys and
        values, up to this many bytes, for later prompts that start alike under the same cache salt
        (`specdraft.backend.prefix`, as the target keeps its own): an agent's next turn catches up on
        its new tokens only (none for a copy of the target, which copies the target's). window: the
        most context tokens a row further behind catches up on (None: all of them; see the module
        docstring; a copy of the target copies what it lacks instead)."""
        self.rows = RowModel(model, layers=layers, dtype=dtype, static=static, compiled=compiled)
        self.prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 and not target_copy else None
        size = model.config.vocab_size
        if vocabulary == "auto":
            reads = self.rows.reads_kept_vocabulary
            vocabulary = DRAFT_VOCABULARY if reads and size >= 2 * DRAFT_VOCABULARY else None
        self.vocabulary = vocabulary
        self._layers_keep_vocabulary = False  # whether the layers read the kept rows only (`also_rows` adds the context's)
        self.window = None if target_copy else window
        if vocabulary is not None:
            if isinstance(vocabulary, bool) or not isinstance(vocabulary, int) or vocabulary % 16 or not 0 < vocabulary <= size:
                raise ValueError(f"the model drafter's vocabulary must be \"auto\" or a multiple of 16 up to the "
                                 f"model's {size} tokens, got {vocabulary!r}")
            self._layers_keep_vocabulary = self.rows.keep_vocabulary(vocabulary)
        self.k = k
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.device = self.rows.device
        self.target_copy = target_copy
        self._target: RowModel | None = None  # the target's rows, once shared
        self._requests: dict[str, _Request] = {}
        self._lag = 2 * k + 2  # more pending tokens than this: catch up before drafting
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= self._lag):
            raise ValueError(f"the model drafter's window must be an integer above {self._lag} (2k + 2) tokens, "
                             f"got {window!r}")
        self._layouts: dict[str | None, tuple[int, int]] = {}  # cache salt -> its last ended row's layout with a gap

    @property
    def parts(self) -> Parts:
        return Parts(free=None, costly=self, costly_name="model", target_cache=self.target_copy)

    def share_target(self, rows: RowModel) -> None:
        if self.rows.cache.layout != rows.cache.layout:
            raise ValueError("the draft model's keys and values are not shaped as the target's: it is not a copy of it")
        self._target = rows

    # -- lifecycle ---------------------------------------------------------------------------
    def begin(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        stream = SAMPLE if params.seed is not None else DRAFT
        request = self._requests[request_id] = _Request(params, request_seed(params), stream, [int(t) for t in prompt_ids])
        self._note_rare(request, request.context)
        self.rows.add(request_id, active=True)
        if self.prefixes is not None:
            self._read_prefix(request_id, request)

    def _read_prefix(self, request_id: str, request: _Request) -> None:
        """Fill the new row from the prefix cache: the longest stored prefix of the prompt, or, where
        the salt's last row with a gap left less to catch up on, of the prompt with that gap (the
        conversation's next turn). All but the last prompt token: the drafting pass's input."""
        salt, prompt = request.params.cache_salt, request.context
        limit = len(prompt) - 1
        behind = limit - self.prefixes.length(salt, prompt, limit)
        kept, skipped = self._layouts.get(salt, (0, 0))
        if skipped and limit > kept + skipped:
            tokens = _held(prompt, kept, skipped, 0, limit - skipped)
            stored = self.prefixes.length(salt, tokens, len(tokens))
            if stored > kept and len(tokens) - stored < behind:
                request.kept, request.skipped = kept, skipped
                self.rows.read_prefix(request_id, self.prefixes, salt, tokens, len(tokens))
                return
        self.rows.read_prefix(request_id, self.prefixes, salt, prompt, limit)

    def accept(self, request_id: str, token_ids: Sequence[int]) -> None:
        request = self._requests[request_id]
        if request.fed or len(request.draft):
            accepted = 0
            while accepted < min(len(request.draft), len(token_ids)) and token_ids[accepted] == request.draft[accepted]:
                accepted += 1
            self.rows.truncate(request_id, request.fed_from + min(accepted, request.fed))
            request.draft, request.fed = np.empty(0, dtype=np.int64), 0
        request.context.extend(int(t) for t in token_ids)
        self._note_rare(request, token_ids)

    def _note_rare(self, request: _Request, token_ids: Sequence[int]) -> None:
        if self.vocabulary is None:
            return
        new = {int(t) for t in token_ids if t >= self.vocabulary} - request.rare
        if new:
            request.rare |= new
            request.rare_ids = torch.tensor(sorted(request.rare), dtype=torch.int64)

    def end(self, request_id: str) -> None:
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if self.prefixes is not None:  # what the row holds of the context (a fed draft's entries are not)
            held = request.fed_from if request.fed else self.rows.length(request_id)
            self.rows.store_prefix(request_id, self.prefixes, request.params.cache_salt, request.held(0, held))
            if request.skipped:  # the salt's latest layout, its entry moved last (the oldest are forgotten)
                self._layouts.pop(request.params.cache_salt, None)
                self._layouts[request.params.cache_salt] = (request.kept, request.skipped)
                while len(self._layouts) > LAYOUTS:
                    del self._layouts[next(iter(self._layouts))]
        self.rows.remove(request_id)

    # -- drafting -----------------------------------------------------------------------------
    def propose(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> list[Draft]:
        return self.propose_costly(request_ids, max_lengths).drafts

    def propose_costly(self, request_ids: Sequence[str], max_lengths: Sequence[int]) -> CostlyDrafts:
        wanted = {r: min(int(n), self.k) for r, n in zip(request_ids, max_lengths) if n > 0}
        if not wanted:
            return CostlyDrafts([EMPTY_DRAFT for _ in request_ids])
        catch_up = self._catch_up(wanted)
        drafting = [r for r in wanted if self._pending(r) <= self._lag]
        tokens, probs, pass_seconds = self._draft({r: wanted[r] for r in drafting})
        return CostlyDrafts([self._finish(r, tokens.get(r), probs.get(r)) for r in request_ids], pass_seconds, catch_up)

    def _pending(self, request_id: str) -> int:
        return self._requests[request_id].length - self.rows.length(request_id)

    def _gap(self, request_id: str) -> tuple[int, int] | None:
        """The layout (kept, skipped) the row takes before it catches up, where its window leaves out
        part of what it is behind on; None where it catches up on everything."""
        if self.window is None or self._pending(request_id) <= self.window:
            return None
        request, length = self._requests[request_id], self.rows.length(request_id)
        kept = request.kept if request.skipped else max(length, SINK)
        skipped = len(request.context) - kept - self.window
        return (kept, skipped) if skipped > request.skipped else None

    def backlog(self, request_id: str) -> int:
        """Tokens this row must catch up on in passes of their own before it drafts (0: its drafting
        pass feeds what it missed): what drafting for it now costs beyond the drafting passes."""
        pending, gap = self._pending(request_id), self._gap(request_id)
        if gap is not None:
            pending = max(gap[0] - self.rows.length(request_id), 0) + self.window
        if self._target is not None and request_id in self._target:  # what the target holds is copied
            pending = min(pending, len(self._requests[request_id].context) - self._target.length(request_id))
        return pending if pending > self._lag else 0

    def _leave_gap(self, request_id: str) -> None:
        """Take the layout `_gap` gives, where it gives one: the row keeps its first `kept` entries."""
        gap = self._gap(request_id)
        if gap is not None:
            request = self._requests[request_id]
            request.kept, request.skipped = gap
            self.rows.truncate(request_id, min(self.rows.length(request_id), request.kept))

    def _catch_up(self, wanted: dict[str, int]) -> CatchUp:
        """Rows asked to draft but far behind: copy what the target holds (where it is shared), then
        feed them part of the rest, one row per pass."""
        # Catch-up tokens per call, over all rows: one prefill pass (the draft's rows own its size).
        budget = widest = self.rows.chunks.widest
        started = time.perf_counter()
        for request_id in wanted:
            self._leave_gap(request_id)
        if self._target is not None:
            for request_id in wanted:
                # A pass feeding two tokens costs what one feeding one does: copy from three on, and
                # leave one context token pending: the drafting pass's input.
                if self._pending(request_id) > 2:
                    self.rows.take_entries(request_id, self._target, len(self._requests[request_id].context) - 1)
        for request_id in wanted:
            pending = self._pending(request_id)
            if pending <= self._lag or budget <= 0:
                continue
            # Leave one pending token: the drafting pass needs an input whose logits give q_1.
            take = min(pending - 1, budget)
            start = self.rows.length(request_id)
            self.rows.prefill(request_id, self._requests[request_id].held(start, start + take))
            budget -= take
        return CatchUp(widest - budget, time.perf_counter() - started)

    def _draft(self, wanted: dict[str, int]) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]], float | None]:
        """Draft wanted[r] tokens for each row r: one packed pass feeding each row its pending tokens
        (every row of the cache riding along, catching up on as many), then one pass per further
        position, fed by the drafting rows alone. Also returns the seconds of one drafting pass (None
        where the only pass also fed a backlog)."""
        if not wanted:
            return {}, {}, None
        order, window = self.rows.active_ids, self.rows.active_window
        if self._layers_keep_vocabulary:
            rare = set().union(*(self._requests[r].rare for r in wanted))
            self.rows.also_rows(np.fromiter(rare, np.int64, len(rare)))
        # First pass: T = the drafting rows' longest backlog; other rows catch up on up to T tokens.
        steps = max(self._pending(r) for r in wanted)
        started = time.perf_counter()
        pieces, feeds = [], np.zeros(len(order), dtype=np.int64)  # the pass's tokens, flat, and each row's count
        for b, request_id in enumerate(order):
            request, start = self._requests[request_id], self.rows.length(request_id)
            # A rider keeps its last pending token: whenever it drafts, its first pass needs one input.
            end = request.length if request_id in wanted else request.length - 1
            pieces.append(np.asarray(request.held(start, min(end, start + steps)), dtype=np.int64))
            feeds[b] = len(pieces[-1])
        assert all(feeds[b] for b, r in enumerate(order) if r in wanted), "a drafting row feeds its first pass"
        logits = self.rows.packed_pass(window, np.concatenate(pieces), feeds, last=True).logits  # [rows fed, vocab]
        self.rows.commit(window, feeds)
        index = {order[b]: i for i, b in enumerate(np.flatnonzero(feeds))}  # each fed row's logits
        for request_id in wanted:
            self._requests[request_id].fed_from = self.rows.length(request_id)
        tokens: dict[str, list[int]] = {r: [] for r in wanted}
        probs: dict[str, list[torch.Tensor]] = {r: [] for r in wanted}
        live = dict(wanted)  # rows still drafting -> their target length
        passes, pass_seconds = 0, None
        while True:
            chosen = self._choose(logits, {r: index[r] for r in live}, tokens)  # reads the logits: in sync
            if passes == 0:
                first, started = time.perf_counter() - started, time.perf_counter()
                if steps <= 2:  # the bonus token and the last draft token: a pass as every step has
                    pass_seconds = first
            else:
                pass_seconds = (time.perf_counter() - started) / passes
            for request_id, (token, q) in chosen.items():
                tokens[request_id].append(token)
                if q is not None:
                    probs[request_id].append(q)
                if token in self.eos and not self._requests[request_id].params.ignore_eos:
                    live[request_id] = len(tokens[request_id])  # the draft ends after EOS
            live = {r: n for r, n in live.items() if len(tokens[r]) < n}
            if not live:
                return tokens, probs, pass_seconds
            # Next pass: the drafting rows feed their newest draft token; the others sit it out.
            drafting = [r for r in order if r in live]  # in the window's order
            fed = np.array([int(r in live) for r in order], dtype=np.int64)
            for request_id in drafting:
                self._requests[request_id].fed += 1
            logits = self.rows.packed_pass(window, np.array([tokens[r][-1] for r in drafting], dtype=np.int64), fed).logits
            self.rows.commit(window, fed)
            index = {r: i for i, r in enumerate(drafting)}
            passes += 1

    def _choose(self, logits: torch.Tensor, rows: dict[str, int], tokens: dict[str, list[int]]):
        """The next draft token of each row (and q where the verifier needs it), as the request samples."""
        if self.vocabulary is not None:  # whichever layers ran the pass (`keep_vocabulary` did so already)
            with torch.inference_mode():  # the pass's logits are inference tensors
                kept = []  # each row's context ids past the vocabulary keep their logits
                for r, b in rows.items():
                    ids = self._requests[r].rare_ids
                    if ids is not None:
                        ids = ids.to(logits.device)
                        kept.append((b, ids, logits[b, ids]))
                logits[:, self.vocabulary :] = float("-inf")
                for b, ids, values in kept:
                    logits[b, ids] = values
        out: dict[str, tuple[int, torch.Tensor | None]] = {}
        greedy = [r for r in rows if self._requests[r].params.greedy]
        if greedy:
            best = argmax(logits[[rows[r] for r in greedy]]).tolist()
            out.update({r: (t, None) for r, t in zip(greedy, best)})
        sampled = [r for r in rows if r not in out]
        if sampled:
            params = [self._requests[r].params for r in sampled]
            q = distribution(logits[[rows[r] for r in sampled]][:, None], params)[:, 0]  # [n, vocab]
            # The draw for the token at context position len(context) + i, as the verifier keys it.
            u = np.array([keyed_uniforms(np.uint64(self._requests[r].seed),
                                         np.array([len(self._requests[r].context) + len(tokens[r])]),
                                         self._requests[r].stream)[0] for r in sampled], dtype=np.float32)
            drawn = inverse_cdf(q, torch.as_tensor(u, device=self.device)).tolist()
            for i, r in enumerate(sampled):
                out[r] = (drawn[i], q[i] if self._requests[r].stream == DRAFT else None)
        return out

    def _finish(self, request_id: str, tokens: list[int] | None, probs: list[torch.Tensor] | None) -> Draft:
        if not tokens:
            return EMPTY_DRAFT
        self._requests[request_id].draft = np.asarray(tokens, dtype=np.int64)
        return Draft(np.asarray(tokens, dtype=np.int32), torch.stack(probs) if probs else None)


@register("model")
def _create(k: int, target: Any, resources: Resources | None = None, draft_model: Any = None,
            vocabulary: int | str | None = "auto", prefix_cache_mb: int = 256, window: int | None = WINDOW) -> ModelDrafter:
    """The draft LM is the one the runtime loaded (`resources.draft`: planned by `Settings.resolve` as
    the target is, `Settings.draft_model`), or `draft_model`, a model given loaded (`LoadedModel`);
    `vocabulary`: draft among the ids below it (and those the request's context holds) only ("auto":
    see `ModelDrafter`); `prefix_cache_mb`: MiB of ended requests' draft keys and values kept for
    prompts that start alike (0: none; `ModelDrafter`); `window`: the most context tokens a row far
    behind catches up on (None: all)."""
    check_cache_mb(prefix_cache_mb, "the model drafter's prefix_cache_mb")
    resources = resources if resources is not None else Resources()
    draft = draft_model if draft_model is not None else resources.draft
    if draft is None or isinstance(draft, str):
        raise ValueError("the model drafter drafts with a loaded model: name it in the settings (draft_model, "
                         "--draft-model), which plan and load it as the target; the drafter option draft_model "
                         f"takes a model already loaded, not {draft!r}")
    return ModelDrafter(draft.model, k=k, eos_token_ids=target.eos_token_ids, dtype=draft.compute_dtype,
                        static=resources.static_shapes, compiled=resources.compiled and worth_compiling(draft.model),
                        target_copy=draft.target_copy, vocabulary=vocabulary, prefix_cache_bytes=prefix_cache_mb << 20,
                        window=window)
