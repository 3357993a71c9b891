"""`specdraft.LLM`, the library front door, on a tiny random Llama (and, marked slow, the embedded
model for the chat template): lossless output through it, batching that does not change a request's
output, streams, metrics, errors that name the problem, and per-request speculation settings."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from specdraft import LLM, Draft, RequestOutput, SamplingParams, SpeculationParams
from specdraft.drafters.base import EMPTY_DRAFT
from specdraft.errors import RequestError
from specdraft.runtime import encode_prompt
from tests.helpers.tiny import TINY_VOCAB, loaded

REPEATING = [33, 34, 35, 36] * 5  # n-gram drafts find matches here
PROMPTS = [REPEATING, [5, 17, 42, 9, 9, 13], "Hello, hello, hello"]
METRICS = ("steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length", "tokens_per_second")


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(loaded(tiny_model), drafters=["none", "ngram"], k=4, max_batch=4)


@pytest.fixture
def registered(monkeypatch):
    """Registers a drafter factory under a name for one test."""
    import specdraft.drafters.registry as registry

    registry.drafter_names()  # plugins are found first, so that they do not forget ours

    def add(name, factory):
        monkeypatch.setitem(registry._REGISTRY, name, factory)

    return add


class Guesser:
    """Only the four verbs: drafts as far as asked every step, guessing the last token plus one."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.last = fail, {}

    def begin(self, request_id, prompt_ids, params):
        self.last[request_id] = prompt_ids[-1]

    def propose(self, request_ids, max_lengths):
        if self.fail:
            raise RuntimeError("no guess today")
        return [Draft(np.full(n, (self.last[r] + 1) % TINY_VOCAB, dtype=np.int32)) if n else EMPTY_DRAFT
                for r, n in zip(request_ids, max_lengths)]

    def accept(self, request_id, token_ids):
        self.last[request_id] = token_ids[-1]

    def end(self, request_id):
        del self.last[request_id]


def drain(stream):
    """A stream's deltas and the output it returns."""
    deltas = []
    while True:
        try:
            deltas.append(next(stream))
        except StopIteration as stop:
            return deltas, stop.value


def test_greedy_ngram_equals_plain_decoding(llm):
    greedy = SamplingParams(max_tokens=30)
    for prompt in PROMPTS:
        [plain] = llm.generate(prompt, greedy, SpeculationParams("none"))
        for policy in ("auto", "fixed"):
            [spec] = llm.generate(prompt, greedy, SpeculationParams("ngram", policy=policy))
            assert spec.token_ids == plain.token_ids and spec.text == plain.text
            assert spec.finish_reason == plain.finish_reason == "length"
    [drafted] = llm.generate(REPEATING, greedy, SpeculationParams("ngram", policy="fixed"))
    assert drafted.metrics.draft_tokens > 0  # drafts were verified, not skipped
    assert plain.metrics.draft_tokens == 0


def test_prompts_decoded_together_equal_each_alone(llm):
    budgets = [SamplingParams(max_tokens=n) for n in (25, 7, 16)]
    together = llm.generate(PROMPTS, budgets)
    alone = [llm.generate(p, b)[0] for p, b in zip(PROMPTS, budgets)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [len(o.token_ids) for o in together] == [25, 7, 16]
    assert [o.prompt_token_ids for o in together] == [o.prompt_token_ids for o in alone]
    assert together[0].prompt_token_ids == REPEATING  # token ids go in as they are
    assert together[2].prompt_token_ids == [ord(c) - 32 for c in PROMPTS[2]]  # text, with no chat template
    assert len({o.request_id for o in together}) == 3
    assert not llm.engine.has_work


def test_metrics_are_present_and_consistent(llm):
    [out] = llm.generate(REPEATING, SamplingParams(max_tokens=20), SpeculationParams("ngram", policy="fixed"))
    assert isinstance(out, RequestOutput)
    m = out.metrics
    assert all(getattr(m, name) is not None for name in METRICS)
    assert m.steps >= 1 and 0 <= m.accepted_tokens <= m.draft_tokens
    assert m.acceptance_rate == pytest.approx(m.accepted_tokens / m.draft_tokens)
    assert m.mean_accepted_length == pytest.approx(m.accepted_tokens / m.steps)
    assert m.tokens_per_second > 0
    # Each step emits its accepted tokens and one of the target's; the first token comes from the prompt.
    assert 1 + m.steps + m.accepted_tokens >= len(out.token_ids)


def test_stream_deltas_add_up_to_generate(llm):
    params = SamplingParams(max_tokens=24)
    for prompt in (REPEATING, "Hello, hello, hello"):
        [whole] = llm.generate(prompt, params)
        deltas, output = drain(llm.stream(prompt, params))
        assert "".join(d.text for d in deltas) == whole.text
        assert [t for d in deltas for t in d.token_ids] == whole.token_ids
        assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["length"]
        assert output.token_ids == whole.token_ids and output.finish_reason == "length"
    assert not llm.engine.has_work


def test_closing_a_stream_early_cancels_its_request(llm):
    stream = llm.stream(REPEATING, SamplingParams(max_tokens=100))
    assert not llm.engine.has_work  # checked at the call, submitted on the first `next`
    first = next(stream)
    assert first.token_ids and first.finish_reason is None
    assert llm.engine.has_work
    stream.close()
    assert not llm.engine.has_work
    [after] = llm.generate(REPEATING, SamplingParams(max_tokens=5))  # the engine serves on
    assert after.token_ids[0] == first.token_ids[0]


def test_interleaved_streams_and_calls_each_get_all_their_deltas(llm):
    params = SamplingParams(max_tokens=18)
    expected = [o.token_ids for o in llm.generate(PROMPTS[:2], params)]
    streams = [llm.stream(p, params) for p in PROMPTS[:2]]
    got: list[list[int]] = [[], []]
    got[0] += next(streams[0]).token_ids
    [other] = llm.generate(PROMPTS[2], params)  # steps the engine while the streams wait
    assert other.finish_reason == "length"
    live = [0, 1]
    while live:  # take turns
        for i in list(live):
            try:
                got[i] += next(streams[i]).token_ids
            except StopIteration:
                live.remove(i)
    assert got == expected
    assert not llm.engine.has_work


@pytest.mark.parametrize(("call", "message"), [
    (lambda llm: llm.generate("abc", SamplingParams(max_tokens=4), SpeculationParams("nope")),
     "drafter 'nope' is not available here; choose one of: ngram, none"),
    (lambda llm: llm.generate(["abc", "   "]), "prompt 1: prompt is empty"),
    (lambda llm: llm.generate([[1, 2], []]), "prompt 1: prompt is empty"),
    (lambda llm: llm.generate([]), "no prompts given"),
    (lambda llm: llm.generate([1, 2, 999]), "token id 999 is outside the vocabulary"),
    (lambda llm: llm.generate(7), "a prompt must be text or a list of token ids, got int"),
    (lambda llm: llm.generate("abc", SpeculationParams("ngram")), "sampling_params must be a SamplingParams"),
    (lambda llm: llm.generate(["a", "b"], [SamplingParams()] * 3), "sampling_params has 3 entries for 2 prompts"),
    (lambda llm: llm.generate("abc", None, SpeculationParams("ngram", num_speculative_tokens=9)),
     "num_speculative_tokens 9 is above this engine's maximum of 4"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}]), "needs a model with a chat template"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}, {"content": "no role"}]),
     "message 1 must be a mapping with a 'role'"),
    (lambda llm: llm.chat("hi"), "a conversation must be a non-empty list of messages"),
    (lambda llm: llm.stream(""), "prompt is empty"),
])
def test_bad_input_is_refused_by_name_before_anything_runs(llm, call, message):
    with pytest.raises(RequestError, match=re.escape(message)):
        call(llm)
    assert not llm.engine.has_work


def test_a_failing_drafter_fails_its_own_request_only(tiny_model, registered):
    registered("test-broken", lambda k: Guesser(fail=True))
    llm = LLM(loaded(tiny_model), drafters=["none", "test-broken"], k=4, max_batch=4, calibrate=False)
    params = SamplingParams(max_tokens=12)
    good, bad = llm.generate([REPEATING, PROMPTS[1]], params,
                             [SpeculationParams("none"), SpeculationParams("test-broken", policy="fixed")])
    assert good.finish_reason == "length" and good.token_ids == llm.generate(REPEATING, params)[0].token_ids
    assert bad.finish_reason == "error"
    assert "test-broken" in bad.error and "no guess today" in bad.error
    assert not llm.engine.has_work


def test_fixed_policy_reaches_the_engine(tiny_model, registered):
    """`fixed` verifies a draft as long as allowed every step, even of a drafter that never guesses
    right; `auto` (the engine's default here) learns to stop asking it."""
    registered("test-guesser", lambda k: Guesser())
    llm = LLM(loaded(tiny_model), drafters=["none", "test-guesser"], k=4, max_batch=2)
    params, k = SamplingParams(max_tokens=40), 4
    [plain] = llm.generate(PROMPTS[1], params, SpeculationParams("none"))
    [fixed] = llm.generate(PROMPTS[1], params, SpeculationParams("test-guesser", policy="fixed"))
    assert fixed.token_ids == plain.token_ids
    generated, expected = 1, 0  # the first token comes with the prompt's prefill
    for accepted in fixed.metrics.accepted_per_step:
        expected += min(k, params.max_tokens - generated - 1)  # the step's own token needs room too
        generated += accepted + 1
    assert fixed.metrics.draft_tokens == expected
    [auto] = llm.generate(PROMPTS[1], params, SpeculationParams("test-guesser"))
    assert auto.token_ids == plain.token_ids
    assert auto.metrics.draft_tokens < fixed.metrics.draft_tokens


@pytest.mark.subprocess
def test_import_is_light_and_exports_the_front_door():
    code = ("import sys, specdraft; assert 'torch' not in sys.modules, 'torch imported'; "
            "names = {'LLM', 'RequestOutput', 'SamplingParams', 'SpeculationParams', 'Draft', 'Drafter', 'register'}; "
            "assert names <= set(dir(specdraft)) and set(specdraft.__all__) >= names; "
            "from specdraft import LLM; assert 'torch' in sys.modules; print(specdraft.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


@pytest.mark.slow
def test_chat_applies_the_template_and_generate_does_not(embedded):
    llm = LLM(embedded, drafters=["none"], max_batch=2, calibrate=False)  # the template is the point here
    conversation = [{"role": "user", "content": "Name three colors."}]
    params = SamplingParams(max_tokens=4)
    one, two = llm.chat([conversation, conversation], params)
    assert one.token_ids == two.token_ids
    assert one.prompt_token_ids == encode_prompt(llm.tokenizer, conversation, chat=True)
    assert "<|im_start|>assistant" in llm.tokenizer.decode(one.prompt_token_ids)
    [again] = llm.chat(conversation, params)  # one conversation, not a list of them
    assert again.token_ids == one.token_ids
    [same] = llm.generate(one.prompt_token_ids, params)  # the templated tokens, given as they are
    assert same.token_ids == one.token_ids
    [raw] = llm.generate("Name three colors.", params)
    assert raw.prompt_token_ids == encode_prompt(llm.tokenizer, "Name three colors.", chat=False)
    assert "<|im_start|>" not in llm.tokenizer.decode(raw.prompt_token_ids)
