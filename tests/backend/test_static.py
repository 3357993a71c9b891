"""The static-shape step (`StaticShapes`: padded batch buckets, KV buckets, a preallocated cache; what
CUDA graphs capture) gives the same tokens and the same KV contents as the dynamic step, across batch
buckets, rows joining and leaving, and every draft length. On CPU it runs eagerly (no graphs)."""

from __future__ import annotations

import pytest
import torch

from specdraft.backend import RowModel, StaticShapes
from specdraft.drafters.model import ModelDrafter
from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier
from tests.helpers.tiny import TINY_VOCAB, ScriptedDrafter, ToyTokenizer, hf_greedy, make_tiny_model, shallow_copy_of

PROMPTS = [[5, 17, 42, 9, 9, 13], list(range(1, 30)), [60], [33, 34, 35, 33, 34, 35, 33, 34], [70, 71, 72, 73] * 5,
           [8, 6, 7, 5, 3, 0, 9], [2, 4, 6, 8], list(range(40, 75))]
STATIC = StaticShapes(max_rows=8, max_context=256, kv_block=32, graphs=False)


@pytest.mark.parametrize("rows, bucket", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_batch_buckets(rows, bucket):
    assert STATIC.batch_bucket(rows) == bucket


@pytest.mark.parametrize("length, bucket", [(1, 32), (32, 32), (33, 64), (250, 256), (256, 256), (270, 288)])
def test_kv_buckets(length, bucket):
    assert STATIC.kv_bucket(length) == bucket


def scripted(references):
    """Drafts the true continuation with corruptions at fixed (step, position) pairs: the same drafts
    in every engine that runs the same requests, of every length up to the limit."""
    counter = {"n": 0}

    def script(context, limit):
        for prompt, truth in references.items():
            if tuple(context[: len(prompt)]) == prompt:
                done = len(context) - len(prompt)
                counter["n"] += 1
                n = counter["n"] % (limit + 1)  # every length 0..limit in turn
                return [(t + 1) % TINY_VOCAB if (counter["n"] + i) % 4 == 0 else t for i, t in enumerate(truth[done : done + n])]
        return []

    return script


def test_static_steps_equal_dynamic_steps_in_tokens_and_cache(tiny_model):
    budgets = [30, 5, 22, 1, 17, 40, 9, 26, 12, 33]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(budgets))]
    references = {tuple(p): hf_greedy(tiny_model, p, 45) for p in PROMPTS}

    def engine(static):
        return Engine(Verifier(tiny_model, static), {"s": ScriptedDrafter(scripted(references))}, ToyTokenizer(), (), 256,
                      k=5, max_batch=6, policy="fixed", calibrate=False, token_budget=16)

    dynamic, static = engine(None), engine(STATIC)
    ids = [(dynamic.submit(p, SamplingParams(max_tokens=n)), static.submit(p, SamplingParams(max_tokens=n)))
           for p, n in zip(prompts, budgets)]
    buckets = set()
    while dynamic.has_work:
        a, b = dynamic.step(), static.step()
        assert [(d.request_id, d.token_ids) for d in a] == [(d.request_id, d.token_ids) for d in b]
        buckets.add(STATIC.batch_bucket(max(1, len(static.verifier.row_ids))))
        for row_id in dynamic.verifier.rows._order:
            slot_a, slot_b = dynamic.verifier.rows.slot(row_id), static.verifier.rows.slot(row_id)
            for layer in range(tiny_model.config.num_hidden_layers):
                for x, y in zip(dynamic.verifier.rows.cache.entries(layer, slot_a), static.verifier.rows.cache.entries(layer, slot_b)):
                    torch.testing.assert_close(x, y, rtol=0, atol=1e-10)
    assert not static.has_work
    assert buckets >= {1, 2, 4, 8}  # every bucket up to the batch ran
    for (a, b), prompt, n in zip(ids, prompts, budgets):
        ours = static.collect(b).token_ids
        assert ours == dynamic.collect(a).token_ids == references[tuple(prompt)][:n]


def test_static_model_drafter_drafts_like_the_dynamic_one():
    target = make_tiny_model(seed=11, layers=4, sharpen=12.0)
    draft = shallow_copy_of(target, keep=[0, 3])
    drafters = [ModelDrafter(draft, k=4), ModelDrafter(draft, k=4, static=STATIC)]
    for drafter in drafters:
        for i, prompt in enumerate(PROMPTS[:5]):
            drafter.begin(f"r{i}", prompt, SamplingParams())
    for step in range(6):
        lengths = [(step + i) % 5 for i in range(5)]
        a, b = (d.propose([f"r{i}" for i in range(5)], lengths) for d in drafters)
        assert [x.token_ids.tolist() for x in a] == [x.token_ids.tolist() for x in b]
        for i, x in enumerate(a):
            accepted = x.token_ids[: step % 3].tolist() + [step]
            for drafter in drafters:
                drafter.accept(f"r{i}", accepted)


def test_a_static_cache_never_grows():
    rows = RowModel(make_tiny_model(), static=StaticShapes(max_rows=2, max_context=64, kv_block=16, graphs=False))
    capacity = rows.cache.capacity
    rows.add("a", active=True)
    rows.add("b", active=True)
    with pytest.raises(RuntimeError, match="the fixed KV cache holds 2 rows of 128 positions"):
        rows.add("c")
    assert rows.cache.capacity == capacity == 128  # 64 + 16, in whole spans (`cache.SPAN`)


def test_static_shapes_need_our_own_forward():
    from transformers import GemmaConfig, GemmaForCausalLM

    model = GemmaForCausalLM(GemmaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, head_dim=16,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="static shapes need a model of a family our forward runs"):
        RowModel(model, static=STATIC)


def test_static_shapes_and_the_compiled_cpu_step_are_refused_together():
    """The compiled CPU step's attention reads a paged cache; static shapes hold a fixed one-block cache."""
    model = make_tiny_model(dtype=torch.float32)
    with pytest.raises(ValueError, match="static shapes .* and the compiled CPU step .* do not combine"):
        RowModel(model, static=StaticShapes(max_rows=2, max_context=64, graphs=False), compiled=True)
