"""The prefix cache (`specdraft.backend.prefix`): a hit reuses exactly the shared prefix, token by token;
salts isolate; eviction keeps outputs and memory within the budget; a request cancelled mid-prefill
leaves nothing behind; and every drafter gives the same output with and without hits across a
multi-turn conversation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft.backend.cache import RowKVCache
from specdraft.backend.prefix import PrefixCache
from specdraft.drafters import create_drafter
from specdraft.engine import Engine
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.runtime import build_runtime
from specdraft.settings import Settings
from specdraft.verifier import Verifier
from tests.helpers.tiny import ToyTokenizer, hf_greedy, loaded, make_tiny_model, shallow_copy_of

LAYERS, HEADS, DIM = 2, 2, 4
TOKEN_BYTES = 2 * LAYERS * HEADS * DIM * 8  # float64 keys and values of one token


def row_cache(rows: int = 2) -> RowKVCache:
    return RowKVCache(LAYERS, HEADS, DIM, torch.float64, torch.device("cpu"), slots=rows)


def filled(cache: RowKVCache, n: int, seed: int) -> int:
    """A new row holding n positions of distinct entries; returns its slot."""
    slot = cache.push_row()
    cache.write(slot, 0, torch.randn((2, LAYERS, HEADS, n, DIM), generator=torch.Generator().manual_seed(seed),
                                     dtype=torch.float64))
    return slot


def test_a_hit_takes_exactly_the_shared_tokens_even_inside_a_stored_run():
    cache, prefixes = row_cache(), PrefixCache(1 << 20)
    stored = list(range(10, 30))  # 20 tokens, one run
    slot = filled(cache, 20, seed=1)
    prefixes.store_prefix(cache, slot, None, stored)
    target = cache.push_row()
    prompt = stored[:13] + [99, 98]  # parts from the run after 13 tokens
    assert prefixes.read_prefix(cache, target, None, prompt, len(prompt) - 1) == 13
    assert torch.equal(cache.read(target, 0, 13), cache.read(slot, 0, 13))
    # The limit holds even where more agrees, and a prompt that agrees on nothing takes nothing.
    again = cache.push_row()
    assert prefixes.read_prefix(cache, again, None, stored, 7) == 7
    other = cache.push_row()
    assert prefixes.read_prefix(cache, other, None, [5, 6, 7], 2) == 0


def test_storing_a_branch_splits_the_run_and_keeps_both_exactly():
    cache, prefixes = row_cache(), PrefixCache(1 << 20)
    first, second = list(range(100, 120)), list(range(100, 108)) + list(range(200, 206))
    a, b = filled(cache, 20, seed=1), filled(cache, 14, seed=2)
    tail = cache.read(b, 8, 14)
    cache.write(b, 0, cache.read(a, 0, 8))  # the same tokens have the same entries
    cache.write(b, 8, tail)
    prefixes.store_prefix(cache, a, None, first)
    prefixes.store_prefix(cache, b, None, second)
    assert prefixes.tokens == 20 + 6  # the shared 8 are held once
    for slot, tokens in ((a, first), (b, second)):
        reader = cache.push_row()
        assert prefixes.read_prefix(cache, reader, None, tokens + [1], len(tokens)) == len(tokens)
        assert torch.equal(cache.read(reader, 0, len(tokens)), cache.read(slot, 0, len(tokens)))


def test_salts_share_nothing():
    cache, prefixes = row_cache(), PrefixCache(1 << 20)
    slot = filled(cache, 10, seed=1)
    prefixes.store_prefix(cache, slot, "tenant-a", list(range(10)))
    for salt, expected in (("tenant-a", 9), ("tenant-b", 0), (None, 0)):
        reader = cache.push_row()
        assert prefixes.read_prefix(cache, reader, salt, list(range(10)), 9) == expected


def test_the_least_recently_used_entries_go_first_and_the_budget_holds():
    cache, prefixes = row_cache(), PrefixCache(25 * TOKEN_BYTES)
    one, two = filled(cache, 10, seed=1), filled(cache, 10, seed=2)
    prefixes.store_prefix(cache, one, None, list(range(10)))
    prefixes.store_prefix(cache, two, None, list(range(50, 60)))
    reader = cache.push_row()
    assert prefixes.read_prefix(cache, reader, None, list(range(10)), 9) == 9  # the first is now the more recent
    three = filled(cache, 10, seed=3)
    prefixes.store_prefix(cache, three, None, list(range(80, 90)))  # 30 tokens > 25: the least recent goes
    assert prefixes.stats.bytes <= prefixes.budget and prefixes.stats.evictions == 1
    assert [prefixes.read_prefix(cache, cache.push_row(), None, tokens, 9) for tokens in
            (list(range(10)), list(range(50, 60)), list(range(80, 90)))] == [9, 0, 9]


# -- the engine ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=11, layers=4, sharpen=12.0)
    return loaded(target), loaded(shallow_copy_of(target, keep=[0, 3]))


def conversation(engine: Engine, turns: int = 3, speculation: SpeculationParams | None = None,
                 params: SamplingParams = SamplingParams(max_tokens=16), salt: str | None = None) -> list[tuple]:
    """A chat replayed turn by turn: each turn's prompt is the last one, its reply and a new message.
    Returns each turn's (prompt, output, cached tokens)."""
    rng = np.random.default_rng(0)
    prompt, out = rng.integers(3, 90, 24).tolist(), []
    for _ in range(turns):
        [done] = engine.run([(prompt, SamplingParams(**{**params.__dict__, "cache_salt": salt}), speculation)])
        out.append((prompt, done.token_ids, done.metrics.cached_tokens))
        prompt = prompt + done.token_ids + rng.integers(3, 90, 7).tolist()
    return out


def test_a_conversation_hits_the_history_and_decodes_as_without_it(pair):
    target, _ = pair
    off = Engine(Verifier(target.model), build_runtime(target, Settings(drafters=["none"], calibrate=False)).engine.drafters,
                 ToyTokenizer(), (), 256, calibrate=False)
    on = Engine(Verifier(target.model, prefix_cache_bytes=1 << 20), off.drafters, ToyTokenizer(), (), 256, calibrate=False)
    cold, warm = conversation(off), conversation(on)
    assert [o for _, o, _ in cold] == [o for _, o, _ in warm]
    for prompt, output, _ in warm:
        assert output == hf_greedy(target.model, prompt, 16)
    # Every turn after the first reuses its whole history but the last reply token (never committed).
    assert [c for _, _, c in cold] == [0, 0, 0]
    previous = [len(p) + len(o) - 1 for p, o, _ in warm[:-1]]
    assert [c for _, _, c in warm] == [0, *previous]


@pytest.mark.parametrize("drafter", ["none", "ngram", "ngram-memory", "model", "hybrid"])
def test_every_drafter_decodes_a_conversation_with_hits_as_none_without(pair, drafter):
    target, draft = pair
    name, options = drafter.split("-")[0], ({"ngram": {"memory": True}} if drafter.endswith("memory") else None)
    reference = conversation(build_runtime(target, Settings(drafters=["none"], calibrate=False, prefix_cache_mb=0)).engine)
    runtime = build_runtime(target, Settings(drafters=[name], draft_model=draft if name in ("model", "hybrid") else None, k=4,
                                             policy="fixed", calibrate=False, drafter_options=options))
    for salt in (None, "again"):  # the second pass has its own salt: cold, while the memory has learned
        turns = conversation(runtime.engine, salt=salt)
        assert [o for _, o, _ in turns] == [o for _, o, _ in reference]
        assert turns[1][2] > 0 and turns[2][2] > turns[1][2]


def test_a_self_draft_copies_the_targets_cached_entries(pair):
    target, _ = pair
    runtime = build_runtime(target, Settings(drafters=["model"], k=4, policy="fixed", calibrate=False))
    reference = conversation(build_runtime(target, Settings(drafters=["none"], calibrate=False, prefix_cache_mb=0)).engine)
    turns = conversation(runtime.engine)
    assert [o for _, o, _ in turns] == [o for _, o, _ in reference]
    assert turns[2][2] > 0


def test_seeded_sampling_gives_the_same_output_with_a_hit(pair):
    target, _ = pair
    params = SamplingParams(max_tokens=16, temperature=0.9, seed=1234)
    off = conversation(build_runtime(target, Settings(drafters=["ngram"], calibrate=False, prefix_cache_mb=0)).engine, params=params)
    on = conversation(build_runtime(target, Settings(drafters=["ngram"], calibrate=False)).engine, params=params)
    assert [o for _, o, _ in on] == [o for _, o, _ in off] and on[2][2] > 0


def chunked_engine(target, max_batch: int, token_budget: int, chunk: int) -> Engine:
    """An engine over `target` with the none drafter and a prefix cache, whose steps take `token_budget`
    tokens and whose prefill passes take `chunk`."""
    return Engine(Verifier(target.model, prefix_cache_bytes=1 << 20, prefill_chunk=chunk), {"none": create_drafter("none")},
                  target.tokenizer, target.eos_token_ids, target.max_context, max_batch=max_batch, calibrate=False,
                  token_budget=token_budget)


def test_a_request_cancelled_mid_prefill_leaves_nothing_a_later_hit_could_read(pair):
    target, _ = pair
    engine = chunked_engine(target, max_batch=2, token_budget=8, chunk=4)  # 4 prompt tokens a step beside a decode
    busy = engine.submit([3, 4, 5], SamplingParams(max_tokens=40))
    engine.step()  # `busy` decodes from here on
    prompt = list(range(10, 60))
    victim = engine.submit(prompt, SamplingParams(max_tokens=4))
    engine.step()
    engine.step()  # a few of its 50 tokens are prefilled
    assert 0 < engine.request(victim).prefilled < len(prompt)
    engine.cancel(victim)
    while engine.has_work:
        engine.step()
    engine.collect(busy)
    assert engine.collect(victim).finish_reason == "cancelled"
    [again] = engine.run([(prompt, SamplingParams(max_tokens=4))])
    assert again.metrics.cached_tokens == 0
    assert again.token_ids == hf_greedy(target.model, prompt, 4)


def test_memory_stays_within_the_budget_under_distinct_long_prompts(pair):
    target, _ = pair
    runtime = build_runtime(target, Settings(drafters=["ngram"], calibrate=False, prefix_cache_mb=1))
    prefixes = runtime.engine.verifier.prefixes
    rng = np.random.default_rng(1)
    per_token = None
    for i in range(12):
        prompt = rng.integers(3, 90, 200).tolist()
        [done] = runtime.engine.run([(prompt, SamplingParams(max_tokens=8))])
        assert done.token_ids == hf_greedy(target.model, prompt, 8)
        assert prefixes.stats.bytes <= 1 << 20
        per_token = per_token or prefixes.stats.bytes // prefixes.tokens
    assert prefixes.stats.evictions > 0 and prefixes.tokens * per_token > (1 << 20) // 2


def test_prefix_cache_mb_is_checked():
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        build_runtime(loaded(make_tiny_model()), Settings(drafters=["none"], calibrate=False, prefix_cache_mb=-1))


def test_requests_admitted_together_share_the_system_prompt_the_first_one_prefilled(pair):
    target, _ = pair
    engine = build_runtime(target, Settings(drafters=["ngram"], max_batch=4, calibrate=False)).engine
    system = list(range(10, 40))
    prompts = [system + [50 + i, 60 + i, 70 + i] for i in range(3)]
    done = engine.run([(p, SamplingParams(max_tokens=8)) for p in prompts])
    assert [d.metrics.cached_tokens for d in done] == [0, 30, 30]
    for prompt, d in zip(prompts, done):
        assert d.token_ids == hf_greedy(target.model, prompt, 8)


def test_prefill_takes_whole_chunks_of_what_the_verified_tokens_leave_and_always_advances(pair):
    target, _ = pair
    prompt = list(range(10, 70))
    # A budget of 12: the rows verify a token each; prefill runs the chunks of 3 that fit in the rest,
    # and at least one (12 - 11 = 1 fits none).
    for rows, prefilled in ((2, 9), (5, 6), (11, 3)):
        engine = chunked_engine(target, max_batch=16, token_budget=12, chunk=3)
        for i in range(rows):
            engine.submit([3 + i, 4, 5], SamplingParams(max_tokens=30))
        while engine.running < rows:  # prefill too runs under the budget: the rows begin over a few steps
            engine.step()  # and decode a token each a step once begun
        late = engine.submit(prompt, SamplingParams(max_tokens=4))
        engine.step()  # the rows verify `rows` tokens, then prefill spends what is left
        assert engine.request(late).prefilled == prefilled
        while engine.has_work:
            engine.step()
        assert engine.collect(late).token_ids == hf_greedy(target.model, prompt, 4)


def test_prefill_passes_fall_at_the_same_positions_whatever_the_budget_or_the_cache(pair):
    """Prefill is fed in chunks at fixed positions (multiples of the chunk from a row's start): the
    budget only decides how many run a step, and a prompt that starts from a cached prefix joins the
    same boundaries, so a prompt's passes never depend on what other rows drafted."""
    target, _ = pair
    prompt = list(range(10, 47))  # 37 tokens

    def passes(token_budget: int, cached: list[int] | None = None) -> list[tuple[int, int]]:
        engine = chunked_engine(target, max_batch=4, token_budget=token_budget, chunk=8)
        if cached is not None:
            engine.run([(cached, SamplingParams(max_tokens=1))])
        engine.submit([3, 4, 5], SamplingParams(max_tokens=40))
        engine.step()
        rows, seen = engine.verifier.rows, []
        forward = rows.forward

        def recorded(window, input_ids, logits_at=None):
            if logits_at is not None and window.start == rows.slot("late"):  # the late prompt's prefill passes
                seen.append((rows.length("late"), len(input_ids[0])))
            return forward(window, input_ids, logits_at)

        rows.forward = recorded
        late = engine.intake.resolve(prompt, SamplingParams(max_tokens=3))
        engine.enqueue(type(late)(**{**late.__dict__, "id": "late"}))
        while engine.has_work:
            engine.step()
        assert engine.collect("late").token_ids == hf_greedy(target.model, prompt, 3)
        return seen

    cold = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 5)]
    assert passes(9) == passes(30) == cold  # one chunk a step, or three
    assert passes(30, cached=prompt[:13] + [90]) == [(13, 3)] + cold[2:]  # from the cached 13 tokens: to 16, then on
