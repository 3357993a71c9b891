"""Engine + verifier on a tiny random Llama: greedy speculative output equals plain greedy output
for any draft, in any batch; rollback restores plain-decoding state; stop rules."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from specdraft.backend import chunks, memory
from specdraft.backend.family import attention_knee
from specdraft.backend.rowmodel import RowModel
from specdraft.drafters import create_drafter
from specdraft.engine import Engine, RequestError
from specdraft.params import SamplingParams
from specdraft.verifier import Batch, Verifier
from tests.helpers.tiny import TINY_VOCAB, ScriptedDrafter, ToyTokenizer, hf_greedy, oracle_script
from tests.helpers.prompts import PROMPTS


def make_engine(model, drafter, k=4, max_batch=8, max_context=256, eos=()):
    return Engine(Verifier(model), {"test": drafter}, ToyTokenizer(), eos, max_context, k=k, max_batch=max_batch,
                  policy="fixed")


@pytest.mark.parametrize("k", [0, 1, 2, 4, 7])
@pytest.mark.parametrize("corrupt_every", [0, 1, 2, 3])
def test_greedy_equals_plain_for_any_draft(tiny_model, references, k, corrupt_every):
    """Drafts of every length 0..k, with mismatches at every position (corrupt_every=1: all wrong)."""
    rng = random.Random(k * 10 + corrupt_every)
    corrupt = (lambda s, i: False) if corrupt_every == 0 else (lambda s, i: rng.randrange(corrupt_every) == 0)
    engine = make_engine(tiny_model, ScriptedDrafter(oracle_script(references, corrupt)), k=k)
    for prompt in PROMPTS:
        [done] = engine.run([(prompt, SamplingParams(max_tokens=40))])
        assert done.token_ids == references[tuple(prompt)]
        assert done.finish_reason == "length"


def test_perfect_drafts_take_k_plus_one_tokens_per_step(tiny_model, references):
    engine = make_engine(tiny_model, ScriptedDrafter(oracle_script(references, lambda s, i: False)), k=4)
    [done] = engine.run([(PROMPTS[1], SamplingParams(max_tokens=40))])
    # 1 token from prefill, then 39 tokens in steps of 5 (the last step is capped by the budget).
    assert done.metrics.steps == 8
    assert done.metrics.acceptance_rate == 1.0


def test_batch_of_mixed_prompts_matches_each_alone(tiny_model, references):
    """Rows of different lengths and drafts, finishing at different steps, joining mid-flight."""
    lengths = [40, 7, 23, 1, 31, 12]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(lengths))]
    rng = random.Random(0)
    drafter = ScriptedDrafter(oracle_script(references, lambda s, i: rng.random() < 0.3))
    engine = make_engine(tiny_model, drafter, k=5, max_batch=3)  # more requests than rows: continuous batching
    done = engine.run([(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, lengths)])
    for prompt, n, completion in zip(prompts, lengths, done):
        assert completion.token_ids == references[tuple(prompt)][:n]
    assert len(drafter.ended) == len(lengths) and not drafter.contexts
    assert engine.verifier.row_ids == []


def test_rollback_restores_plain_decoding_state(tiny_model, references):
    """After rejected drafts, the cache holds exactly the keys/values plain decoding would hold."""
    prompt = PROMPTS[1]
    truth = references[tuple(prompt)]
    verifier = Verifier(tiny_model)
    first = verifier.admit("r", prompt, SamplingParams())
    assert first == truth[0]
    # Draft 4 tokens: 2 right, then wrong ones; the verifier must keep prompt + first + 2 accepted.
    from specdraft.drafters.base import Draft
    import numpy as np

    wrong = [(t + 1) % TINY_VOCAB for t in truth[3:5]]
    verdict = verifier.step(Batch.of(["r"], [first], [Draft(np.array(truth[1:3] + wrong, dtype=np.int32))]))
    assert verdict.emitted(0) == truth[:4][1:] and verdict.accepted[0] == 2
    length = verifier.length("r")
    assert length == len(prompt) + 3

    plain = DynamicCache(config=tiny_model.config)
    with torch.inference_mode():
        tiny_model(torch.tensor([prompt + truth[:3]], device=tiny_model.device), past_key_values=plain, use_cache=True)
    for layer in range(tiny_model.config.num_hidden_layers):
        ours_k, ours_v = verifier.rows.cache.entries(layer, verifier.rows.slot("r"))
        torch.testing.assert_close(ours_k, plain.layers[layer].keys[0], rtol=0, atol=1e-10)
        torch.testing.assert_close(ours_v, plain.layers[layer].values[0], rtol=0, atol=1e-10)
    # And decoding goes on exactly as plain decoding.
    assert verifier.step(Batch.of(["r"], [truth[3]], [None])).emitted(0) == [truth[4]]


def test_a_row_that_sits_a_pass_out_keeps_its_cache_and_decodes_on_as_plain_decoding(tiny_model, references):
    """The verifier runs a pass over the rows it is given; an active row left out (its request failed
    in a stage before the pass) is fed nothing and keeps what it had."""
    verifier = Verifier(tiny_model)
    truths = [references[tuple(p)] for p in PROMPTS[:2]]
    firsts = [verifier.admit(f"r{i}", p, SamplingParams()) for i, p in enumerate(PROMPTS[:2])]
    lengths = [verifier.length(f"r{i}") for i in range(2)]
    verdict = verifier.step(Batch.of(["r0"], [firsts[0]], [None]))
    assert len(verdict) == 1 and verdict.emitted(0) == truths[0][1:2]
    assert verifier.length("r1") == lengths[1] and verifier.length("r0") == lengths[0] + 1
    verdict = verifier.step(Batch.of(["r0", "r1"], [truths[0][1], firsts[1]], [None, None]))
    assert verdict.emitted(0) == truths[0][2:3] and verdict.emitted(1) == truths[1][1:2]


def test_eos_inside_accepted_draft_stops_at_eos(tiny_model, references):
    prompt = PROMPTS[0]
    truth = references[tuple(prompt)]
    eos = truth[6]
    stop_at = truth.index(eos)
    engine = make_engine(tiny_model, ScriptedDrafter(oracle_script(references, lambda s, i: False)), k=7, eos=(eos,))
    [done] = engine.run([(prompt, SamplingParams(max_tokens=40))])
    assert done.token_ids == truth[: stop_at + 1]
    assert done.finish_reason == "stop"
    assert done.token_ids == hf_greedy(tiny_model, prompt, 40, eos_token_id=eos)


def test_ignore_eos_keeps_going(tiny_model, references):
    prompt = PROMPTS[0]
    truth = references[tuple(prompt)]
    engine = make_engine(tiny_model, create_drafter("none"), eos=(truth[2],))
    [done] = engine.run([(prompt, SamplingParams(max_tokens=10, ignore_eos=True))])
    assert done.token_ids == truth[:10]


def test_what_fits_is_the_default_limit_and_a_max_tokens_past_the_context_is_refused(tiny_model, references):
    """One room rule, at intake: no max_tokens generates what fits (never past the context, drafts
    included); a max_tokens that fits is kept; one that does not is refused, naming the numbers, with
    OpenAI's code, before anything runs."""
    prompt = PROMPTS[1]  # 17 tokens
    engine = make_engine(tiny_model, ScriptedDrafter(oracle_script(references, lambda s, i: False)), k=7, max_context=30)
    [whole, exact] = engine.run([(prompt, SamplingParams()), (prompt, SamplingParams(max_tokens=13))])
    for done in (whole, exact):
        assert done.token_ids == references[tuple(prompt)][:13] and done.finish_reason == "length"
    with pytest.raises(RequestError, match="max_tokens is 14, but the prompt has 17 tokens and this model's context "
                                           "is 30: at most 13 tokens can be generated") as refused:
        engine.submit(prompt, SamplingParams(max_tokens=14))
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "max_tokens")
    assert not engine.has_work


def test_prompt_that_fills_the_context_is_rejected(tiny_model):
    engine = make_engine(tiny_model, create_drafter("none"), max_context=8)
    with pytest.raises(RequestError, match="prompt has 8 tokens; this model's context is 8 tokens") as refused:
        engine.submit(list(range(8)), SamplingParams())
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "prompt")
    with pytest.raises(RequestError, match="prompt is empty"):
        engine.submit([], SamplingParams())


def test_stop_string_truncates_text(tiny_model, references):
    prompt = PROMPTS[2]
    truth = references[tuple(prompt)]
    text = ToyTokenizer().decode(truth)
    stop = text[5:7]
    first = text.find(stop)
    engine = make_engine(tiny_model, create_drafter("ngram", k=4))
    [done] = engine.run([(prompt, SamplingParams(max_tokens=40, stop=(stop,)))])
    assert done.finish_reason == "stop"
    assert done.text == text[:first]
    assert done.token_ids == truth[: len(done.token_ids)]


def test_max_tokens_one_stops_after_prefill(tiny_model, references):
    engine = make_engine(tiny_model, create_drafter("ngram", k=4))
    [done] = engine.run([(PROMPTS[0], SamplingParams(max_tokens=1))])
    assert done.token_ids == references[tuple(PROMPTS[0])][:1]
    assert done.metrics.steps == 0


def test_seed_reproduces_sampled_output(tiny_model):
    def sample(seed, drafter="ngram"):
        engine = make_engine(tiny_model, create_drafter(drafter, k=4))
        [done] = engine.run([(PROMPTS[3], SamplingParams(max_tokens=30, temperature=1.0, top_p=0.9, seed=seed))])
        return done.token_ids

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_greedy_and_sampled_rows_share_a_batch(tiny_model, references):
    engine = make_engine(tiny_model, create_drafter("ngram", k=4))
    done = engine.run(
        [
            (PROMPTS[0], SamplingParams(max_tokens=30)),
            (PROMPTS[3], SamplingParams(max_tokens=30, temperature=0.8, top_k=20, seed=1)),
            (PROMPTS[1], SamplingParams(max_tokens=30)),
        ]
    )
    assert done[0].token_ids == references[tuple(PROMPTS[0])][:30]
    assert done[2].token_ids == references[tuple(PROMPTS[1])][:30]
    assert len(done[1].token_ids) == 30


def test_long_prompt_is_prefilled_in_chunks_while_others_keep_decoding(tiny_model, references):
    """Running rows get a token in every step while a long prompt is admitted over several steps."""
    engine = Engine(Verifier(tiny_model, prefill_chunk=3), {"none": create_drafter("none")}, ToyTokenizer(), (), 256,
                    k=4, max_batch=4, token_budget=8)
    short = [engine.submit(p, SamplingParams(max_tokens=40)) for p in PROMPTS[:2]]
    while engine.running < 2:  # their prefill, under the step's budget too
        engine.step()
    long_prompt = [(7 * i) % TINY_VOCAB for i in range(60)]
    long_id = engine.submit(long_prompt, SamplingParams(max_tokens=10))
    steps_until_first = 0
    while True:
        deltas = {d.request_id: d for d in engine.step()}
        steps_until_first += 1
        assert all(r in deltas and deltas[r].token_ids for r in short)  # no stream stalls
        if long_id in deltas:
            break
    # The step's budget of 8 tokens, less the 2 the running rows verify: two chunks of 3 prompt tokens a step.
    assert steps_until_first == 60 // (8 - 2)
    while engine.has_work:
        engine.step()
    for request_id, prompt in zip(short, PROMPTS[:2]):
        assert engine.collect(request_id).token_ids == references[tuple(prompt)]
    assert engine.collect(long_id).token_ids == hf_greedy(tiny_model, long_prompt, 10)


def test_a_short_request_overtakes_a_long_prefill(tiny_model, references):
    """With no row decoding, a long prompt is still fed a budget a step, and a short prompt submitted
    after it goes first (fewest tokens left first): its first token comes in the next step, long
    before the long prompt's, which waits where both do not fit."""
    engine = Engine(Verifier(tiny_model, prefill_chunk=4), {"none": create_drafter("none")}, ToyTokenizer(), (), 256,
                    k=4, max_batch=4, token_budget=6)
    long_prompt = [(7 * i) % TINY_VOCAB for i in range(60)]
    long_id = engine.submit(long_prompt, SamplingParams(max_tokens=10))
    engine.step()
    assert engine.request(long_id).prefilled == 4  # a chunk of 4 (two would be over the budget), not the prompt
    short_id = engine.submit(PROMPTS[0], SamplingParams(max_tokens=40))  # 6 tokens: two chunks, 4 and 2
    deltas = {d.request_id: d for d in engine.step()}
    assert short_id in deltas and deltas[short_id].token_ids  # its first token
    assert long_id not in deltas and engine.request(long_id).prefilled == 4
    while engine.has_work:
        engine.step()
    assert engine.collect(short_id).token_ids == references[tuple(PROMPTS[0])]
    assert engine.collect(long_id).token_ids == hf_greedy(tiny_model, long_prompt, 10)


def test_a_prompt_that_begins_as_one_being_prefilled_waits_for_its_prefix(tiny_model):
    """Requests that share a long system prompt prefill it once: the later one starts from the cache."""
    engine = Engine(Verifier(tiny_model, prefill_chunk=4, prefix_cache_bytes=1 << 20), {"none": create_drafter("none")},
                    ToyTokenizer(), (), 256, k=4, max_batch=4, token_budget=8)
    system = [(5 * i) % TINY_VOCAB for i in range(40)]
    first, second = (engine.submit(system + tail, SamplingParams(max_tokens=3)) for tail in ([1, 2], [3, 4]))
    while engine.has_work:
        engine.step()
    assert engine.collect(first).metrics.cached_tokens == 0
    done = engine.collect(second)
    assert done.metrics.cached_tokens >= 32 and done.token_ids == hf_greedy(tiny_model, system + [3, 4], 3)


def test_cancel_frees_rows_and_drafter_state_in_every_phase(tiny_model):
    drafter = ScriptedDrafter(lambda context, limit: [1] * limit)
    engine = Engine(Verifier(tiny_model, prefill_chunk=2), {"scripted": drafter}, ToyTokenizer(), (), 256, k=4,
                    max_batch=2, token_budget=4)
    running = engine.submit(PROMPTS[1], SamplingParams(max_tokens=50))
    engine.step()
    prefilling = engine.submit(list(range(1, 30)), SamplingParams(max_tokens=50))
    waiting = engine.submit(PROMPTS[0], SamplingParams(max_tokens=50))
    engine.step()  # the second prompt is part-way through its prefill; the third waits for a row
    for request_id in (running, prefilling, waiting):
        engine.cancel(request_id)
        assert engine.collect(request_id).finish_reason == "cancelled"
    assert not engine.has_work and engine.verifier.row_ids == [] and not drafter.contexts
    assert engine.verifier.rows.cache.rows == 0


def test_an_engine_and_its_rows_refuse_a_budget_or_chunk_below_one(tiny_model):
    with pytest.raises(ValueError, match="token_budget must be >= 1, got 0"):
        Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, token_budget=0)
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1, got 0"):
        Verifier(tiny_model, prefill_chunk=0)


@pytest.mark.parametrize("start, stop, end", [(0, 100, 8), (0, 5, 5), (3, 100, 8), (8, 100, 16), (13, 14, 14), (15, 40, 16)])
def test_a_prefill_pass_ends_at_the_next_multiple_of_the_chunk(tiny_model, start, stop, end):
    assert Verifier(tiny_model, prefill_chunk=8).rows.chunks.end(start, stop) == end


def test_prefill_passes_shorten_where_attention_outweighs_the_projections(tiny_model):
    """The tiny model's attention costs as much as its projections at 288 entries (`attention_knee`):
    a pass from position b takes 128 * 288 / (288 + b) tokens (a multiple of 16, at least 64), and
    counts as a whole chunk's work in the budget; the output is the model's whichever passes feed it."""
    assert attention_knee(tiny_model.config) == 288
    assert attention_knee(LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                      num_key_value_heads=3)) == 3072  # SmolLM2-135M
    rows = Verifier(tiny_model, prefill_chunk=128).rows
    assert [rows.chunks.end(start, 10_000) for start in (0, 100, 128, 150, 208, 272)] == [128, 128, 208, 208, 272, 336]
    assert (rows.chunks.cost(0, 128), rows.chunks.cost(128, 208), rows.chunks.cost(128, 168), rows.chunks.cost(208, 216)) == (
        128, 128, 64, 16)
    engine = Engine(Verifier(tiny_model, prefill_chunk=128), {"none": create_drafter("none")}, ToyTokenizer(), (), 256,
                    max_batch=2, token_budget=128)
    prompt = [(11 * i + 3) % TINY_VOCAB for i in range(240)]
    request_id = engine.submit(prompt, SamplingParams(max_tokens=6))
    progress = []
    while engine.has_work:
        engine.step()
        progress.append(engine.request(request_id).prefilled)
    assert progress[:3] == [128, 208, 240]  # a pass a step: each a whole chunk's work
    assert engine.collect(request_id).token_ids == hf_greedy(tiny_model, prompt, 6)


def test_a_prefill_pass_on_cpu_takes_at_most_pass_work(tiny_model, monkeypatch):
    """A larger model's first pass is shorter (its projections' multiply-adds at most PASS_WORK), a
    multiple of 16 and never under MIN_CHUNK; a small chunk is left as it is."""
    per_token = 2 * 36864  # the tiny model's two layers' projections
    for work, chunk, widest in ((100 * per_token, 512, 96), (10 * per_token, 512, 64), (10 * per_token, 48, 48),
                                (1000 * per_token, 512, 512)):
        monkeypatch.setattr(chunks, "PASS_WORK", work)
        assert RowModel(tiny_model, prefill_chunk=chunk).chunks.widest == widest


def test_the_steps_chosen_drafts_count_in_its_token_budget(tiny_model):
    """Running rows' tokens come first, this step's chosen drafts included; prefill gets what is left."""
    prompt = [(7 * i) % TINY_VOCAB for i in range(30)]
    for drafted, prefilled in ((0, 9), (3, 3)):  # 12 - 2 x 1 = 10: three chunks of 3; 12 - 2 x 4 = 4: one
        drafter = ScriptedDrafter(lambda context, limit: [1] * min(limit, drafted))
        engine = Engine(Verifier(tiny_model, prefill_chunk=3), {"s": drafter}, ToyTokenizer(), (), 256, k=4,
                        max_batch=4, policy="fixed", calibrate=False, token_budget=12)
        for p in PROMPTS[:2]:
            engine.submit(p, SamplingParams(max_tokens=20))
        while engine.running < 2:  # the two rows are prefilled
            engine.step()
        late = engine.submit(prompt, SamplingParams(max_tokens=2))
        engine.step()
        assert engine.request(late).prefilled == prefilled


def test_the_engine_tells_the_policy_once_a_step(tiny_model):
    """Each decode step reports to the policy exactly once (`record`), whatever its rows drafted."""
    engine = make_engine(tiny_model, create_drafter("ngram"), k=4, max_batch=4)
    engine.policy = spy = CountingPolicy(engine.policy)
    for prompt in PROMPTS[:3]:
        engine.submit(prompt, SamplingParams(temperature=0, max_tokens=12))
    per_step = []
    while engine.has_work:
        before, decoding = spy.records, engine.running > 0
        engine.step()
        per_step.append((decoding, spy.records - before))
    assert [n for decoding, n in per_step if decoding] and all(n == 1 for decoding, n in per_step if decoding)
    assert all(n == 0 for decoding, n in per_step if not decoding)


class CountingPolicy:
    """The engine's policy, its `record` calls counted."""

    def __init__(self, policy):
        self.policy, self.records = policy, 0

    def record(self, report):
        self.records += 1
        return self.policy.record(report)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_a_long_row_hands_its_memory_back_when_it_ends(tiny_model, monkeypatch):
    """A row longer than a prefill chunk returns the C heap's free pages when it goes (`memory.return_freed`);
    short rows do not pay for it."""
    calls = []
    monkeypatch.setattr(memory, "return_freed", lambda: calls.append(1))
    engine = Engine(Verifier(tiny_model, prefill_chunk=16), {"none": create_drafter("none")}, ToyTokenizer(), (), 256,
                    max_batch=2, calibrate=False)
    engine.run([(PROMPTS[0], SamplingParams(max_tokens=4))])
    assert calls == []
    engine.run([([(3 * i) % TINY_VOCAB for i in range(40)], SamplingParams(max_tokens=4))])
    assert calls == [1]
