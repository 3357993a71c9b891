"""Structured output on a tiny random Llama (toy character tokens): constrained greedy output is the
same with every drafter and equals Hugging Face `generate` masked by the same grammar; outputs parse
and validate; an illegal draft token never reaches the verifier; sampled tokens have the masked
distribution (total variation, with a negative control); seeded constrained sampling is the same
alone and in a batch; bad formats are refused by name; a budget that ends mid-object says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from specdraft.drafters import create_drafter
from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.drafters.hybrid import HybridDrafter
from specdraft.drafters.model import ModelDrafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.engine import Engine, RequestError
from specdraft.engine.constrain import legal
from specdraft.grammar import GrammarCompiler, GrammarError, mask_words, unpack
from specdraft.params import ResponseFormat, SamplingParams, SpeculationParams
from specdraft.sampling import distribution
from specdraft.verifier import Verifier
from tests.helpers.acceptance import padded_rejection_sample
from tests.helpers.tiny import GRAMMAR_EOS, TINY_VOCAB, GrammarTokens, ScriptedDrafter, ToyTokenizer, make_tiny_model, shallow_copy_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "specdraft-copycat"))
from specdraft_copycat import Copycat  # noqa: E402  (the example plugin: the four verbs only)

K = 4
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog", "cow"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["ab", "ac", "b"]}, "maxItems": 3},
    },
    "required": ["kind", "ok", "n", "tags"],
    "additionalProperties": False,
}
FORMATS = {"schema": ResponseFormat.json_schema(SCHEMA), "object": ResponseFormat.json_object()}
PROMPTS = [[5, 17, 42, 9, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [60], [33, 34, 35, 33, 34, 35, 33, 34]]
ILLEGAL = ord("~") - 32  # '~' appears nowhere in SCHEMA's JSON


def toy(text: str) -> list[int]:
    return GrammarTokens()(text)


def text_of(tokens: list[int]) -> str:
    return "".join(chr(32 + t) for t in tokens if t != GRAMMAR_EOS)


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(GrammarTokens(), TINY_VOCAB, [GRAMMAR_EOS])


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=11, layers=4, sharpen=12.0)
    return target, shallow_copy_of(target, keep=[0, 3])


class Adversary(ScriptedDrafter):
    """Drafts the reference continuation with every third token replaced by one the grammar forbids."""

    def __init__(self, references: dict[tuple, list[int]]) -> None:
        def script(context, limit):
            for prompt, out in references.items():
                if tuple(context[: len(prompt)]) == prompt:
                    truth = out[len(context) - len(prompt):][:limit]
                    return [ILLEGAL if i % 3 == 2 else t for i, t in enumerate(truth)] or [ILLEGAL] * limit
            return []

        super().__init__(script)


def engine_for(pair, compiler, drafters=None, max_batch=8, policy="fixed", references=None):
    """Every built-in drafter, the example plugin, and an adversary drafting from `references`
    (filled in by the test: prompt -> constrained greedy output)."""
    target, draft = pair
    eos = (GRAMMAR_EOS,)
    drafters = drafters or {
        "none": create_drafter("none"),
        "ngram": NgramDrafter(k=K, eos_token_ids=eos),
        "model": ModelDrafter(draft, k=K, eos_token_ids=eos),
        "hybrid": HybridDrafter(NgramDrafter(k=K, eos_token_ids=eos), ModelDrafter(draft, k=K, eos_token_ids=eos), min_match=3),
        "copycat": Copycat(),
        "adversary": Adversary({} if references is None else references),
    }
    return Engine(Verifier(target), drafters, ToyTokenizer(), eos, 256, k=K, max_batch=max_batch, policy=policy,
                  grammar=compiler)


class GrammarMask(LogitsProcessor):
    """Hugging Face `generate` constrained by the same grammar, one token at a time: the reference."""

    def __init__(self, compiler: GrammarCompiler, response_format: ResponseFormat, prompt_length: int) -> None:
        self.grammar, self.prompt_length = compiler.matcher(response_format), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.grammar.advance(input_ids[0, self.prompt_length + self.grammar.emitted:].tolist())
        bits = torch.empty((1, mask_words(scores.shape[-1])), dtype=torch.int32)
        self.grammar.masks([], bits)
        return scores.masked_fill(~unpack(bits, scores.shape[-1]), float("-inf"))


def hf_constrained(model, compiler, response_format, prompt, max_new_tokens):
    input_ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=GRAMMAR_EOS, pad_token_id=0, temperature=None, top_p=None,
                             top_k=None, logits_processor=LogitsProcessorList([GrammarMask(compiler, response_format, len(prompt))]))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_constrained_greedy_is_the_same_with_every_drafter_and_equals_masked_generate(pair, compiler, fmt):
    references: dict[tuple, list[int]] = {}
    engine = engine_for(pair, compiler, references=references)
    params = SamplingParams(max_tokens=90, response_format=FORMATS[fmt])
    plain = {tuple(p): engine.run([(p, params, SpeculationParams("none"))])[0] for p in PROMPTS}
    for prompt in PROMPTS:
        assert plain[tuple(prompt)].token_ids == hf_constrained(pair[0], compiler, FORMATS[fmt], prompt, 90)
    references.update({p: done.token_ids for p, done in plain.items()})
    drafted = 0
    for name in ("ngram", "model", "hybrid", "copycat", "adversary"):
        for prompt in PROMPTS:
            [done] = engine.run([(prompt, params, SpeculationParams(name))])
            assert done.token_ids == references[tuple(prompt)], (name, prompt)
            drafted += done.metrics.draft_tokens
    assert drafted > 0
    stopped = [done for done in plain.values() if done.finish_reason == "stop"]
    assert stopped  # some outputs are whole JSON values, which must parse and validate
    for done in stopped:
        value = json.loads(text_of(done.token_ids))
        jsonschema.validate(value, SCHEMA if fmt == "schema" else {"type": "object"})
        assert done.metrics.grammar.complete is True


def test_a_batch_of_constrained_and_free_rows_matches_each_alone(pair, compiler):
    engine = engine_for(pair, compiler)
    names = ["ngram", "model", "hybrid", "copycat", "none"]
    requests = [(PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=8 + 5 * i, response_format=[None, *FORMATS.values()][i % 3]),
                 SpeculationParams(names[i % len(names)])) for i in range(10)]
    together = engine.run(requests)
    for request, done in zip(requests, together):
        [alone] = engine.run([(request[0], request[1], SpeculationParams("none"))])
        assert done.token_ids == alone.token_ids


def test_an_illegal_draft_token_is_never_verified(pair, compiler, monkeypatch):
    references: dict[tuple, list[int]] = {}
    engine = engine_for(pair, compiler, references=references)
    params = SamplingParams(max_tokens=60, response_format=FORMATS["schema"])
    references.update({tuple(p): engine.run([(p, params, SpeculationParams("none"))])[0].token_ids for p in PROMPTS})
    verified: list[list[int]] = []
    step = engine.verifier.step

    def spy(batch):
        verified.extend(batch.draft(r).tolist() for r in range(len(batch)) if batch.counts[r])
        return step(batch)

    monkeypatch.setattr(engine.verifier, "step", spy)
    for prompt in PROMPTS:
        [done] = engine.run([(prompt, params, SpeculationParams("adversary"))])
        assert done.token_ids == references[tuple(prompt)]
        assert done.metrics.accepted_tokens > 0
    assert verified and not any(ILLEGAL in draft for draft in verified)


def test_forced_tokens_are_drafted_for_free_even_where_the_drafter_has_nothing(pair, compiler):
    nothing = ScriptedDrafter(lambda context, limit: [])
    engine = engine_for(pair, compiler, drafters={"none": create_drafter("none"), "nothing": nothing})
    params = SamplingParams(max_tokens=60, response_format=FORMATS["schema"])
    [plain] = engine.run([(PROMPTS[0], params, SpeculationParams("none"))])
    [done] = engine.run([(PROMPTS[0], params, SpeculationParams("nothing"))])
    assert done.token_ids == plain.token_ids
    grammar = done.metrics.grammar
    assert grammar.forced_draft_tokens >= len('{"kind": "') and grammar.forced_accepted_tokens > 0
    assert done.metrics.steps < plain.metrics.steps
    assert plain.metrics.draft_tokens == 0 and plain.metrics.grammar.forced_draft_tokens == 0  # none: plain decoding


def test_seeded_constrained_sampling_is_the_same_alone_and_in_a_batch_of_eight(pair, compiler):
    engine = engine_for(pair, compiler, policy="auto")
    names = ["ngram", "model", "hybrid", "copycat", "none", "model", "ngram", "hybrid"]
    requests = [(PROMPTS[i % len(PROMPTS)],
                 SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, seed=100 + i, response_format=FORMATS["schema"]),
                 SpeculationParams(names[i])) for i in range(8)]
    together = engine.run(requests)
    for (prompt, params, speculation), done in zip(requests, together):
        [alone] = engine.run([(prompt, params, SpeculationParams("none"))])
        assert done.token_ids == alone.token_ids
        if done.finish_reason == "stop":
            jsonschema.validate(json.loads(text_of(done.token_ids)), SCHEMA)


def test_every_sampled_output_is_legal(pair, compiler):
    engine = engine_for(pair, compiler, policy="auto")
    for i in range(12):
        params = SamplingParams(max_tokens=80, temperature=1.0, response_format=FORMATS["schema"])
        [done] = engine.run([(PROMPTS[i % len(PROMPTS)], params, SpeculationParams(["model", "hybrid", "ngram"][i % 3]))])
        grammar = compiler.matcher(FORMATS["schema"])
        assert grammar.legal_prefix(done.token_ids) == len(done.token_ids)
        if done.finish_reason == "stop":
            jsonschema.validate(json.loads(text_of(done.token_ids)), SCHEMA)


# -- sampling distribution under a grammar ---------------------------------------------------
N = 100_000
A, B, C, D, QUOTE = (ord(c) - 32 for c in 'abcd"')


def _p(weights: dict[int, float]) -> torch.Tensor:
    """A distribution over the toy vocabulary: the given weights, the rest spread evenly."""
    p = torch.full((TINY_VOCAB,), (1.0 - sum(weights.values())) / (TINY_VOCAB - len(weights)), dtype=torch.float64)
    for token, weight in weights.items():
        p[token] = weight
    return p


# Inside a string of the enum {"ab", "ac", "b"}: first a or b, after a then b or c, after b the quote.
P0, P1 = _p({A: 0.3, B: 0.3, C: 0.2}), _p({B: 0.2, C: 0.4, QUOTE: 0.1})
Q0, Q1 = _p({A: 0.1, B: 0.4, C: 0.5 - 1e-9}), _p({B: 0.5, C: 0.2, D: 0.3 - 1e-9})  # q puts mass on illegal tokens


def _constrained_draws(compiler, probabilistic: bool):
    """One verify decision for N rows inside `"`: drafts drawn from q, cut at their first illegal
    token, masks from the grammar, then acceptance (as the verifier does for a constrained row,
    `probabilistic=False`; testing the cut draft against q is the negative control)."""
    gen = torch.Generator().manual_seed(7)
    draft = torch.stack([torch.multinomial(Q0.float(), N, replacement=True, generator=gen),
                         torch.multinomial(Q1.float(), N, replacement=True, generator=gen)], 1)  # [N, 2]
    grammar = compiler.matcher(ResponseFormat.json_schema({"enum": ["ab", "ac", "b"]}))
    grammar.advance(toy('"'))
    cut, masks = {}, {}
    for row in draft.unique(dim=0).tolist():  # few distinct drafts: cut and mask each once
        n = grammar.legal_prefix(row)
        bits = torch.full((3, mask_words(TINY_VOCAB)), -1, dtype=torch.int32)
        grammar.masks(row[:n], bits)
        cut[tuple(row)], masks[tuple(row)] = n, unpack(bits, TINY_VOCAB)
    keys = [tuple(r) for r in draft.tolist()]
    lengths = torch.tensor([cut[key] for key in keys])
    padded = torch.where(torch.arange(2)[None, :] < lengths[:, None], draft, -1)  # [N, 2]
    allowed = torch.stack([masks[key] for key in keys])  # [N, 3, vocab]
    logits = torch.stack([P0, P1, P1]).log().float().expand(N, 3, TINY_VOCAB)
    params = [SamplingParams(temperature=1.0)] * N
    p = distribution(logits.masked_fill(~allowed, float("-inf")), params)
    u = torch.rand(N, 3, 3, generator=gen)
    if not probabilistic:
        return padded_rejection_sample(p, padded, u)
    q = torch.stack([Q0, Q1]).float().expand(N, 2, TINY_VOCAB)
    return padded_rejection_sample(p, padded, u, q, torch.ones(N, dtype=torch.bool))


def _tvd(samples: torch.Tensor, dist: torch.Tensor) -> float:
    empirical = torch.bincount(samples, minlength=dist.numel()).double() / samples.numel()
    return 0.5 * (empirical - dist.double()).abs().sum().item()


def _masked(p: torch.Tensor, legal: list[int]) -> torch.Tensor:
    out = torch.zeros_like(p)
    out[legal] = p[legal]
    return out / out.sum()


def test_sampled_tokens_under_a_grammar_have_the_masked_distribution(compiler):
    tokens, accepted = _constrained_draws(compiler, probabilistic=False)
    assert _tvd(tokens[:, 0], _masked(P0, [A, B])) < 0.01
    after_a = (accepted >= 1) & (tokens[:, 0] == A)  # rows whose second token was decided after "a
    assert after_a.sum() > 4_000  # expected N * q0(a) * p0(a | legal) = 5,000
    assert _tvd(tokens[after_a, 1], _masked(P1, [B, C])) < 0.02
    assert not torch.isin(tokens[:, 0], torch.tensor([C, D])).any()


def test_negative_control_testing_cut_drafts_against_q_is_biased(compiler):
    tokens, _ = _constrained_draws(compiler, probabilistic=True)
    assert _tvd(tokens[:, 0], _masked(P0, [A, B])) > 0.05


# -- edges -------------------------------------------------------------------------------------
@pytest.mark.parametrize("schema, message", [
    ({"type": "objekt"}, "Invalid type: objekt"),
    ({"type": "string", "pattern": "(("}, "regex parse error"),
    ({"$ref": "#/nowhere"}, "does not exist"),
])
def test_a_schema_that_cannot_compile_is_refused_naming_the_problem(pair, compiler, schema, message):
    engine = engine_for(pair, compiler)
    params = SamplingParams(response_format=ResponseFormat.json_schema(schema))
    with pytest.raises(RequestError, match="response_format: the JSON schema cannot be used") as caught:
        engine.resolve(PROMPTS[0], params)
    assert message in str(caught.value)
    with pytest.raises(RequestError, match=message):
        engine.submit(PROMPTS[0], params)
    assert not engine.has_work


def test_an_engine_without_a_grammar_compiler_refuses_response_formats(pair):
    engine = engine_for(pair, None)
    with pytest.raises(RequestError, match="built without a grammar compiler"):
        engine.submit(PROMPTS[0], SamplingParams(response_format=FORMATS["object"]))


@pytest.mark.parametrize("bad, message", [
    (lambda: ResponseFormat("xml"), "must be one of json_object, json_schema"),
    (lambda: ResponseFormat("json_schema"), "json_schema needs a schema"),
    (lambda: ResponseFormat("json_schema", "{not json"), "not JSON text"),
    (lambda: ResponseFormat.json_schema([1, 2]), "a JSON schema is an object"),
    (lambda: SamplingParams(ignore_eos=True, response_format=FORMATS["object"]), "ignore_eos cannot be combined"),
    (lambda: SamplingParams(response_format={"type": "json_object"}), "must be a ResponseFormat"),
])
def test_bad_response_formats_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_a_budget_that_ends_mid_object_finishes_with_length_and_says_so(pair, compiler):
    engine = engine_for(pair, compiler)
    [done] = engine.run([(PROMPTS[0], SamplingParams(max_tokens=6, response_format=FORMATS["schema"]),
                          SpeculationParams("ngram"))])
    assert done.finish_reason == "length" and len(done.token_ids) == 6
    assert done.metrics.grammar.complete is False


def test_grammar_state_lookahead_leaves_the_state_as_it_was(compiler):
    grammar = compiler.matcher(FORMATS["schema"])
    assert text_of(grammar.forced([], 50)) == '{"kind": "'
    assert grammar.legal_prefix(toy('{"kind": "dog", "ok": ~')) == len('{"kind": "dog", "ok": ')
    bits = torch.zeros((3, mask_words(TINY_VOCAB)), dtype=torch.int32)
    grammar.masks(toy('{"'), bits)
    allowed = unpack(bits, TINY_VOCAB)
    assert allowed[0].nonzero().flatten().tolist() == toy("{")
    assert allowed[2].nonzero().flatten().tolist() == toy("k")
    whole = toy('{"kind": "cow", "ok": true, "n": 7, "tags": ["b"]}')
    assert grammar.legal_prefix([*whole, GRAMMAR_EOS, 3]) == len(whole) + 1  # nothing after the end
    assert grammar.emitted == 0 and not grammar.complete(0)
    grammar.advance([*whole, GRAMMAR_EOS])
    assert grammar.complete(len(whole) + 1)
    assert grammar.forced([], 9) == [] and grammar.legal_prefix(toy("{")) == 0
    assert not grammar.complete(len(whole) - 1)  # what a request kept when it stopped one token short


def test_draft_cut_keeps_the_drafter_kind_and_forced_tokens_are_their_own(compiler):
    grammar = compiler.matcher(FORMATS["schema"])
    copy = Draft(np.asarray(toy('{"kind": "d~~'), dtype=np.int32), kind="copy3")
    cut = legal(grammar, copy, 11, True)  # no room for forced tokens
    assert text_of(cut.draft.token_ids.tolist()) == '{"kind": "d' and cut.draft.kind == "copy3" and cut.forced_from is None
    longer = legal(grammar, copy, 14, True)  # "og\"" is forced after "d
    assert text_of(longer.draft.token_ids.tolist()) == '{"kind": "dog"' and longer.draft.kind == "copy3"
    assert longer.forced_from == 11
    forced = legal(grammar, EMPTY_DRAFT, 6, True)
    assert text_of(forced.draft.token_ids.tolist()) == '{"kind' and forced.draft.kind == "forced" and forced.forced_from == 0
    assert legal(grammar, EMPTY_DRAFT, 6, False).draft is EMPTY_DRAFT


def test_a_bad_draft_of_a_constrained_request_fails_that_request_only(pair, compiler):
    """A draft token outside the vocabulary is refused by the verifier, naming it, as for any
    request; the other rows of the batch finish as they would alone."""
    bad = ScriptedDrafter(lambda context, limit: [TINY_VOCAB + 5] if limit else [])
    engine = engine_for(pair, compiler, drafters={"none": create_drafter("none"), "bad": bad})
    params = SamplingParams(max_tokens=30, response_format=FORMATS["schema"])
    broken, fine = engine.run([(PROMPTS[0], params, SpeculationParams("bad")), (PROMPTS[1], params, SpeculationParams("none"))])
    assert broken.finish_reason == "error" and "outside the vocabulary" in broken.error
    [alone] = engine.run([(PROMPTS[1], params, SpeculationParams("none"))])
    assert fine.token_ids == alone.token_ids and fine.finish_reason == alone.finish_reason


class FailingGrammars:
    """A compiler whose every second request's grammar fails (as the grammar library can, on a
    resource limit) at the `after`-th call of `method`."""

    def __init__(self, compiler: GrammarCompiler, method: str, after: int) -> None:
        self.compiler, self.method, self.after, self.made = compiler, method, after, 0

    def matcher(self, response_format):
        grammar = self.compiler.matcher(response_format)
        self.made += 1
        if self.made % 2 == 0:
            calls, real = [0], getattr(grammar, self.method)

            def failing(*args):
                calls[0] += 1
                if calls[0] > self.after:
                    raise GrammarError(f"the grammar failed: out of fuel in {self.method}")
                return real(*args)

            setattr(grammar, self.method, failing)
        return grammar


@pytest.mark.parametrize("method, after", [("masks", 0), ("masks", 3), ("advance", 2), ("legal_prefix", 2)])
def test_a_grammar_that_fails_while_decoding_fails_its_request_alone(pair, compiler, method, after):
    """Wherever a request's grammar fails (its first mask, a later mask, advancing over emitted
    tokens, cutting a draft), that request ends with the grammar's error and what it had; the other
    request of the batch finishes as it would alone."""
    params = SamplingParams(max_tokens=40, response_format=FORMATS["schema"])
    [alone] = engine_for(pair, compiler).run([(PROMPTS[0], params, SpeculationParams("ngram"))])
    engine = engine_for(pair, FailingGrammars(compiler, method, after))
    fine, broken = engine.run([(PROMPTS[0], params, SpeculationParams("ngram")),
                               (PROMPTS[3], params, SpeculationParams("ngram"))])
    assert broken.finish_reason == "error" and f"out of fuel in {method}" in broken.error
    assert fine.token_ids == alone.token_ids and fine.finish_reason == alone.finish_reason
    assert not engine.has_work and engine.verifier.row_ids == []


def test_a_stop_string_inside_the_json_leaves_it_incomplete(pair, compiler):
    engine = engine_for(pair, compiler)
    [done] = engine.run([(PROMPTS[0], SamplingParams(max_tokens=60, stop=('"',), response_format=FORMATS["schema"]),
                          SpeculationParams("ngram"))])
    assert done.finish_reason == "stop" and done.text == "{"
    assert done.metrics.grammar.complete is False


def test_boolean_schemas_and_an_engine_without_an_end_token(pair, compiler):
    engine = engine_for(pair, compiler)
    any_value = engine.resolve(PROMPTS[0], SamplingParams(response_format=ResponseFormat.json_schema(True)))
    assert any_value.grammar is not None  # compiled once, at intake
    with pytest.raises(RequestError, match="the JSON schema is false, which no value satisfies"):
        engine.resolve(PROMPTS[0], SamplingParams(response_format=ResponseFormat.json_schema(False)))
    target, _ = pair
    silent = Engine(Verifier(target), {"none": create_drafter("none")}, ToyTokenizer(), (), 256, k=K, grammar=compiler)
    with pytest.raises(RequestError, match="no end-of-sequence token"):
        silent.submit(PROMPTS[0], SamplingParams(response_format=FORMATS["object"]))
