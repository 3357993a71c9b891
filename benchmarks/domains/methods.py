"""The methods the batch-1 benchmarks compare on one loaded model, each run on one prompt's token ids,
greedy: specdraft's engine with `none`, `ngram`, `hybrid`, and `ngram` with the cross-request memory
(its own engine, so the memory learns from every earlier request it served), `ngram` at other longest
drafts (`ngram k=K`, an engine per K), all without the prefix cache (each prompt runs under every
method: a cache would let the later methods reuse the earlier one's prefill); `none+cache`,
`ngram+cache`, `hybrid+cache`, each on an engine of its own with the prefix cache, which holds what
that method itself computed for the earlier requests (a conversation's earlier turns); and the
Hugging Face peers (plain `generate`, the reference every output must equal, and its prompt lookup).

Every run returns a dict: `token_ids`, `tokens_per_second`, `seconds` and, for specdraft's methods,
`steps`, `draft_tokens`, `accepted_tokens`, `time_to_first_token` and `decode_tokens_per_second`
(after the first token, which prefill gives).
"""

from __future__ import annotations

from typing import Callable

from benchmarks.peers import hf as peers
from specdraft.models import LoadedModel, load_model
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.runtime import build_runtime, encode_prompt
from specdraft.settings import Settings

OURS = ("none", "ngram", "hybrid", "ngram+memory", "none+cache", "ngram+cache", "hybrid+cache")
CACHED = "+cache"  # a method's name ends so: its own engine, with the prefix cache
PEERS = ("hf-generate", "hf-prompt-lookup-k10")
REFERENCE = "hf-generate"


def decode_rate(done) -> float:
    """A finished request's tokens after the first over the seconds after it (prefill gives the first);
    0 where it has none."""
    m = done.metrics
    decode = m.seconds - m.time_to_first_token if m.time_to_first_token is not None else 0.0
    return (len(done.token_ids) - 1) / decode if decode > 0 else 0.0


def engine_run(engine, drafter: str, ids: list[int], params: SamplingParams) -> dict:
    """One request through a specdraft engine, alone; its tokens and what it cost."""
    [done] = engine.run([(ids, params, SpeculationParams(drafter))])
    m = done.metrics
    return {"token_ids": done.token_ids, "decode_tokens_per_second": decode_rate(done),
            "tokens_per_second": m.tokens_per_second, "steps": m.steps, "draft_tokens": m.draft_tokens,
            "accepted_tokens": m.accepted_tokens, "seconds": m.seconds, "time_to_first_token": m.time_to_first_token,
            "cached_tokens": m.cached_tokens, "prompt_tokens": len(ids)}


def display_order(names) -> list[str]:
    """Ours first (OURS' order, then `ngram k=K` by K), the peers last."""
    def key(name: str) -> tuple:
        if name in OURS:
            return (0, OURS.index(name))
        if name in PEERS:
            return (2, PEERS.index(name))
        return (1, int(name.rsplit("=", 1)[1]))
    return sorted(names, key=key)


class Methods:
    """`run(name, ids)` for each of `names` (a subset of OURS + PEERS) at longest draft k, and for
    `ngram k=K` at each K of `long_ks`; `names` lists them all, ours first."""

    def __init__(self, loaded: LoadedModel, names: tuple[str, ...], k: int, max_tokens: int,
                 long_ks: tuple[int, ...] = ()) -> None:
        unknown = set(names) - set(OURS) - set(PEERS)
        assert not unknown, unknown
        self.names = display_order([*names, *(f"ngram k={x}" for x in long_ks)])
        self.params = SamplingParams(max_tokens=max_tokens)
        plain = [n for n in names if n in OURS and n != "ngram+memory" and not n.endswith(CACHED)]
        self._engines = {}
        if plain:
            engine = build_runtime(loaded, Settings(drafters=plain, k=k, max_batch=1, prefix_cache_mb=0)).engine
            self._engines.update({n: (engine, n) for n in plain})
        for x in long_ks:
            self._engines[f"ngram k={x}"] = (build_runtime(loaded, Settings(drafters=["ngram"], k=x, max_batch=1,
                                                                            prefix_cache_mb=0)).engine, "ngram")
        for name in (n for n in names if n.endswith(CACHED)):
            drafter = name.removesuffix(CACHED)
            self._engines[name] = (build_runtime(loaded, Settings(drafters=[drafter], k=k, max_batch=1)).engine, drafter)
        self._memory = None
        if "ngram+memory" in names:
            runtime = build_runtime(loaded, Settings(drafters=["ngram"], k=k, max_batch=1, prefix_cache_mb=0,
                                                     drafter_options={"ngram": {"memory": True}}))
            self._engines["ngram+memory"] = (runtime.engine, "ngram")
            self._memory = runtime.engine.drafters["ngram"].memory
        self._peers: dict[str, Callable] = {}
        if any(n in PEERS for n in names):
            # The stock model (no specdraft layers) for the peers, on the same device.
            stock = load_model(None, device=loaded.model.device, dtype="auto", few_rows_linears=False, weights="dense")
            call = {"hf-generate": peers.hf_generate,
                    "hf-prompt-lookup-k10": lambda *a: peers.hf_prompt_lookup(*a, num_tokens=10)}
            self._peers = {n: (lambda ids, fn=call[n]: fn(stock.model, ids, max_tokens, stock.eos_token_ids))
                           for n in names if n in PEERS}
        warm = encode_prompt(loaded.tokenizer, "Say hello.")
        for name, (engine, drafter) in self._engines.items():
            if name != "ngram+memory":  # its memory would learn the warm-up
                engine_run(engine, drafter, warm, SamplingParams(max_tokens=8))

    def run(self, name: str, ids: list[int], memory_state: tuple | None = None) -> dict:
        """`name` on `ids`; with `memory_state` (from `memory_state()`), the memory is first put back
        to it, so that repeats of a prompt do not draft from the memory of its earlier runs."""
        if memory_state is not None and self._memory is not None:
            self._memory.keys[:], self._memory.vals[:], self._memory.stats[:] = memory_state
        if name in self._engines:
            engine, drafter = self._engines[name]
            return engine_run(engine, drafter, ids, self.params)
        result = self._peers[name](ids)
        return {"token_ids": list(result.token_ids), "tokens_per_second": result.tokens_per_second,
                "seconds": result.seconds}

    def memory_state(self) -> tuple | None:
        """A copy of the cross-request memory's tables (None without `ngram+memory`)."""
        if self._memory is None:
            return None
        return self._memory.keys.copy(), self._memory.vals.copy(), self._memory.stats.copy()
