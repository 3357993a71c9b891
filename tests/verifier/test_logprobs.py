"""Logprobs (`SamplingParams.logprobs`) on a tiny random Llama: each emitted token's entry is the
log-softmax of the target's raw logits where it was decided (a plain forward's, before temperature,
top-k, top-p and grammar masks), with its position's most likely tokens; entries line up with the
tokens through the engine and `LLM`, streamed or not; rows that ask for none get none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdraft import LLM, ResponseFormat, SamplingParams, SpeculationParams, TokenLogprob
from specdraft.drafters import create_drafter
from specdraft.drafters.base import Draft
from specdraft.engine import Engine
from specdraft.grammar import GrammarCompiler
from specdraft.verifier import Batch, Verifier
from tests.helpers.tiny import GRAMMAR_EOS, TINY_VOCAB, GrammarTokens, ScriptedDrafter, ToyTokenizer, loaded, oracle_script

PROMPT = [5, 17, 42, 9, 9, 13]
REPEATING = [33, 34, 35, 36] * 5


def reference(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of a plain forward's logits at the positions that decide `tokens`: [len(tokens), vocab]."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens], device=model.device)).logits[0].float()
    return torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) - 1 + len(tokens)].cpu()


def check(entries: list[TokenLogprob], tokens: list[int], expected: torch.Tensor, top: int) -> None:
    """Each entry is its token's, its values are `expected`'s (close: another pass shape rounds otherwise),
    and its top tokens are the `top` most likely, most likely first."""
    assert [e.token for e in entries] == tokens
    for i, entry in enumerate(entries):
        assert entry.logprob == pytest.approx(float(expected[i, entry.token]), abs=1e-5)
        assert len(entry.top) == top
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True)
        want = expected[i].topk(top)
        assert [t for t, _ in entry.top] == want.indices.tolist()
        assert values == pytest.approx(want.values.tolist(), abs=1e-5)


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_logprobs_out_of_range_is_refused_by_value(bad):
    with pytest.raises(ValueError, match=f"logprobs must be an integer between 0 and 20 .*got {bad!r}"):
        SamplingParams(logprobs=bad)


def test_verifier_logprobs_are_the_plain_forwards(tiny_model):
    """Prefill, then verify passes of drafts partly accepted: every emitted token's entry."""
    verifier = Verifier(tiny_model)
    verifier.add("r", SamplingParams(max_tokens=32, logprobs=3))
    verifier.add("quiet", SamplingParams(max_tokens=32))
    first = verifier.prefill("r", PROMPT, last=True)
    assert verifier.prefill("quiet", [7, 8, 9], last=True).logprobs[0] is None  # asked for none: gets none
    tokens, entries = first.emitted(0), list(first.logprobs[0])
    for step in range(6):
        draft = Draft(np.array([(tokens[-1] * 7 + i) % TINY_VOCAB for i in range(step % 4)], dtype=np.int32))
        verdict = verifier.step(Batch.of(["r", "quiet"], [tokens[-1], 1], [draft, None]))
        assert verdict.logprobs[1] is None
        tokens += verdict.emitted(0)
        entries += verdict.logprobs[0]
        assert len(verdict.logprobs[0]) == len(verdict.emitted(0))
    check(entries, tokens, reference(tiny_model, PROMPT, tokens), 3)


def test_speculative_greedy_drafts_give_the_plain_tokens_and_logprobs(tiny_model):
    """Drafts of the plain continuation (every third token wrong), verified several tokens a pass."""
    plain_engine = Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, k=4,
                          policy="fixed", calibrate=False)
    [plain] = plain_engine.run([(PROMPT, SamplingParams(max_tokens=30, logprobs=2))])
    oracle = ScriptedDrafter(oracle_script({tuple(PROMPT): plain.token_ids}, lambda s, i: i % 3 == 2))
    engine = Engine(Verifier(tiny_model), {"oracle": oracle}, ToyTokenizer(), (), 256, k=4, policy="fixed",
                    calibrate=False)
    [speculative] = engine.run([(PROMPT, SamplingParams(max_tokens=30, logprobs=2))])
    assert speculative.metrics.accepted_tokens >= 10
    assert speculative.token_ids == plain.token_ids
    expected = reference(tiny_model, PROMPT, plain.token_ids)
    check(plain.logprobs, plain.token_ids, expected, 2)
    check(speculative.logprobs, plain.token_ids, expected, 2)


@pytest.mark.parametrize("params", [dict(temperature=0.8, seed=3), dict(temperature=1.3, top_k=5, top_p=0.7, seed=4)])
def test_sampled_rows_get_the_raw_logprobs(tiny_model, params):
    """Not the tempered or filtered distribution's: the target's own (vLLM's default raw logprobs)."""
    engine = Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, calibrate=False)
    [done] = engine.run([(PROMPT, SamplingParams(max_tokens=20, logprobs=4, **params))])
    check(done.logprobs, done.token_ids, reference(tiny_model, PROMPT, done.token_ids), 4)


def test_a_constrained_rows_logprobs_are_before_its_grammars_mask(tiny_model):
    compiler = GrammarCompiler(GrammarTokens(), TINY_VOCAB, [GRAMMAR_EOS])
    engine = Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (GRAMMAR_EOS,), 256,
                    calibrate=False, grammar=compiler)
    params = SamplingParams(max_tokens=12, logprobs=5, response_format=ResponseFormat.json_object())
    [done] = engine.run([(PROMPT, params)])
    expected = reference(tiny_model, PROMPT, done.token_ids)
    check(done.logprobs, done.token_ids, expected, 5)
    assert done.token_ids[0] == ord("{") - 32  # the grammar chose it ...
    assert done.logprobs[0].top[0][0] != done.token_ids[0]  # ... not the model: its top tokens are unmasked


def test_entries_line_up_with_the_tokens_kept(tiny_model):
    """A budget that ends inside a step's tokens keeps their entries only; a row that asks for none gets None."""
    oracle_engine = Engine(Verifier(tiny_model), {"none": create_drafter("none")}, ToyTokenizer(), (), 256,
                           calibrate=False)
    [plain] = oracle_engine.run([(PROMPT, SamplingParams(max_tokens=24))])
    assert plain.logprobs is None
    oracle = ScriptedDrafter(oracle_script({tuple(PROMPT): plain.token_ids}, lambda s, i: False))
    engine = Engine(Verifier(tiny_model), {"oracle": oracle}, ToyTokenizer(), (), 256, k=4, policy="fixed",
                    calibrate=False)
    for budget in (1, 2, 7, 13):
        [done] = engine.run([(PROMPT, SamplingParams(max_tokens=budget, logprobs=0))])
        assert done.token_ids == plain.token_ids[:budget]
        assert [e.token for e in done.logprobs] == done.token_ids and all(e.top == () for e in done.logprobs)


def test_llm_outputs_and_stream_deltas_carry_logprobs(tiny_model):
    llm = LLM(loaded(tiny_model), drafters=["none", "ngram"], k=4, max_batch=4, calibrate=False)
    params = SamplingParams(max_tokens=24, logprobs=1)
    [plain] = llm.generate(REPEATING, params, SpeculationParams("none"))
    [ngram] = llm.generate(REPEATING, params, SpeculationParams("ngram", policy="fixed"))
    assert ngram.token_ids == plain.token_ids
    expected = reference(tiny_model, REPEATING, plain.token_ids)
    check(plain.logprobs, plain.token_ids, expected, 1)
    check(ngram.logprobs, plain.token_ids, expected, 1)
    stream, deltas = llm.stream(REPEATING, params, SpeculationParams("ngram", policy="fixed")), []
    while True:
        try:
            deltas.append(next(stream))
        except StopIteration as stop:
            streamed = stop.value
            break
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert [e for d in deltas for e in d.logprobs] == streamed.logprobs
    check(streamed.logprobs, plain.token_ids, expected, 1)
    [quiet] = llm.generate(REPEATING, SamplingParams(max_tokens=4))
    assert quiet.logprobs is None
