"""The model backend: our Llama-family forward equals the stock model's, `RowModel` keeps every row's
cache intact while rows join, activate and leave, a row takes another model's committed entries,
a layer subset runs exactly those layers, and the int8 draft layers approximate the full-precision
ones."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specdraft.backend import RowModel, forward
from specdraft.backend.weight_only_int8 import WeightOnlyInt8Linear, use_weight_only_int8
from specdraft.backend.linear import FewRowsLinear
from tests.helpers.tiny import TINY_VOCAB, make_tiny_model


def stock_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids], device=model.device)).logits[0].float()  # [T, vocab]


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_of_different_lengths(dtype, atol):
    model = make_tiny_model(seed=3, dtype=dtype, layers=3, rope_theta=5000.0)
    assert forward.supports(model)
    rows = RowModel(model, prefill_chunk=7)
    assert rows.own_forward
    rng = random.Random(0)
    contexts = {f"r{i}": [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(1, 40))] for i in range(5)}
    for row_id, ids in contexts.items():
        rows.add(row_id, active=True)
        head = ids[: len(ids) // 2 + 1]
        logits = rows.prefill(row_id, head)  # several chunks
        torch.testing.assert_close(logits, stock_logits(model, head)[-1], rtol=0, atol=atol)
    # One batched pass: each row gets its next 3 tokens (padded where the context ends).
    window = rows.active_window
    steps = 3
    inputs = np.zeros((5, steps), dtype=np.int64)
    for b, (row_id, ids) in enumerate(contexts.items()):
        rest = (ids[rows.length(row_id):] + [0, 0, 0])[:steps]
        inputs[b] = rest
    logits = rows.forward(window, inputs)  # [5, 3, vocab]
    for b, (row_id, ids) in enumerate(contexts.items()):
        have = rows.length(row_id)
        reference = stock_logits(model, ids[:have] + inputs[b].tolist())
        torch.testing.assert_close(logits[b], reference[have : have + steps], rtol=0, atol=atol)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_a_packed_pass_computes_only_real_tokens_and_equals_the_stock_model(dtype, atol):
    """Rows of one packed pass fed 1, 4, 2 and 3 tokens (a verify step's drafts of different lengths):
    each fed token's logits, in the flat layout, equal the stock model's, no other token's are
    computed, and a row then decodes on exactly as if only its tokens had been fed."""
    model = make_tiny_model(seed=4, dtype=dtype, layers=2)
    rows = RowModel(model, prefill_chunk=16)
    assert rows.packs
    rng = random.Random(1)
    contexts = {f"r{i}": [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 30))] for i in range(4)}
    counts = [1, 4, 2, 3]
    for row_id, ids in contexts.items():
        rows.add(row_id, active=True)
        rows.prefill(row_id, ids)
    inputs = np.array([[rng.randrange(TINY_VOCAB) for _ in range(4)] for _ in counts], dtype=np.int64)
    flat = np.concatenate([inputs[b, :n] for b, n in enumerate(counts)])
    logits = rows.packed_pass(rows.active_window, flat, np.array(counts)).logits  # [10, vocab]
    assert logits.shape[0] == sum(counts)
    starts = np.cumsum([0] + counts)
    for b, (row_id, ids) in enumerate(contexts.items()):
        real = inputs[b, : counts[b]].tolist()
        reference = stock_logits(model, ids + real)
        torch.testing.assert_close(logits[starts[b] : starts[b + 1]], reference[len(ids):], rtol=0, atol=atol)
    rows.commit(rows.active_window, counts)
    after = rows.forward(rows.active_window, np.full((4, 1), 7, dtype=np.int64))
    for b, (row_id, ids) in enumerate(contexts.items()):
        full = ids + inputs[b, : counts[b]].tolist() + [7]
        torch.testing.assert_close(after[b, 0], stock_logits(model, full)[-1], rtol=0, atol=atol)


def test_stock_path_for_other_architectures_matches_too():
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    model = GemmaForCausalLM(config).double().eval()
    rows = RowModel(model, prefill_chunk=3)
    assert not rows.own_forward  # not a model our forward claims to reproduce
    ids = [5, 9, 33, 2, 71, 8, 8, 40]
    rows.add("r", active=True)
    torch.testing.assert_close(rows.prefill("r", ids), stock_logits(model, ids)[-1], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match=r"needs a model of a family our forward runs \(llama, mistral, qwen2, qwen3, gemma3_text, phi3\), not 'gemma'"):
        RowModel(model, layers=[0])


def test_rows_join_activate_and_leave_without_disturbing_each_other(tiny_model):
    """Random adds, activations and removals: every row's cached keys stay those of its own tokens,
    active rows stay packed at the front, and a batched pass over them is still exact."""
    rows = RowModel(tiny_model, prefill_chunk=5)
    rng = random.Random(1)
    contexts: dict[str, list[int]] = {}
    for step in range(60):
        action = rng.random()
        if action < 0.45 or not contexts:
            row_id = f"r{step}"
            contexts[row_id] = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(1, 12))]
            rows.add(row_id, active=rng.random() < 0.5)
            rows.prefill(row_id, contexts[row_id])
        elif action < 0.7:
            waiting = [r for r in contexts if r not in rows.active_ids]
            if waiting:
                rows.activate(rng.choice(waiting))
        else:
            row_id = rng.choice(list(contexts))
            rows.remove(row_id)
            del contexts[row_id]
        assert set(rows.active_ids) <= set(contexts) and rows.active_ids == rows._order[: len(rows.active_ids)]
    for row_id, ids in contexts.items():
        plain = DynamicCache(config=tiny_model.config)
        with torch.inference_mode():
            tiny_model(torch.tensor([ids], device=tiny_model.device), past_key_values=plain, use_cache=True)
        for layer in range(tiny_model.config.num_hidden_layers):
            keys, values = rows.cache.entries(layer, rows.slot(row_id))
            torch.testing.assert_close(keys, plain.layers[layer].keys[0], rtol=0, atol=1e-10)
            torch.testing.assert_close(values, plain.layers[layer].values[0], rtol=0, atol=1e-10)


def test_truncate_rolls_back_and_decoding_goes_on_exactly(tiny_model):
    rows = RowModel(tiny_model, prefill_chunk=16)
    rows.add("r", active=True)
    ids = [4, 8, 15, 16, 23, 42]
    rows.prefill("r", ids)
    rows.forward(rows.active_window, np.array([[1, 2, 3]]))
    rows.commit(rows.active_window, [3])
    rows.truncate("r", len(ids))  # the three tokens never happened
    logits = rows.forward(rows.active_window, np.array([[7]]))[0, 0]
    torch.testing.assert_close(logits, stock_logits(tiny_model, ids + [7])[-1], rtol=0, atol=1e-10)


def test_a_row_takes_another_models_entries_and_decodes_on_as_if_it_had_computed_them(tiny_model):
    """`take_entries` copies what the source committed past the row's own entries (another slot
    there, another dtype), and nothing for a row the source does not hold or past its length."""
    source, rows = RowModel(tiny_model), RowModel(copy.deepcopy(tiny_model).float())  # float64 entries into float32
    ids = [4, 8, 15, 16, 23, 42, 7, 9]
    source.add("other", active=True)
    source.prefill("other", [1, 2, 3])
    source.add("r", active=True)
    source.prefill("r", ids)
    rows.add("r", active=True)
    rows.prefill("r", ids[:3])  # its own first entries stay
    assert rows.take_entries("r", source, 6) == 3 and rows.length("r") == 6
    assert rows.take_entries("r", source, 100) == 2 and rows.length("r") == 8  # up to what the source holds
    assert rows.take_entries("r", source, 100) == 0
    rows.add("absent", active=True)
    assert rows.take_entries("absent", source, 5) == 0 and rows.length("absent") == 0
    assert rows.cache.layout == source.cache.layout != RowModel(make_tiny_model(layers=1)).cache.layout
    logits = rows.forward(rows.window_of("r"), np.array([[5]]))[0, 0]
    torch.testing.assert_close(logits.double(), stock_logits(tiny_model, ids + [5])[-1].double(), rtol=0, atol=1e-4)


def test_layer_subset_runs_exactly_those_layers():
    full = make_tiny_model(seed=5, layers=4)
    shallow = make_tiny_model(seed=6, layers=2)
    shallow.load_state_dict({k.replace("layers.3.", "layers.1."): v for k, v in full.state_dict().items()
                             if ".layers." not in k or ".layers.0." in k or ".layers.3." in k})
    rows = RowModel(full, layers=[0, 3], prefill_chunk=3)
    rows.add("r", active=True)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    torch.testing.assert_close(rows.prefill("r", ids), stock_logits(shallow, ids)[-1], rtol=0, atol=1e-10)


def test_int8_linear_approximates_the_full_precision_layer():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=True)
    x = torch.randn(7, 96)
    exact = linear(x)
    for layer in (WeightOnlyInt8Linear(linear), WeightOnlyInt8Linear(FewRowsLinear(linear))):
        out = layer(x).float()
        assert layer.weight.dtype == torch.int8
        assert (out - exact).norm() / exact.norm() < 0.02


def test_int8_copy_shares_the_targets_other_tensors():
    from specdraft.models import LoadedModel, int8_copy

    model = make_tiny_model(seed=2, dtype=torch.float32, layers=2)
    target = LoadedModel(model, None, "tiny", None, 256, (), False)
    draft = int8_copy(target)
    assert draft.model.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert isinstance(draft.model.lm_head, WeightOnlyInt8Linear) and type(model.lm_head) is torch.nn.Linear
    assert not any(type(m) is torch.nn.Linear for m in draft.model.modules())
    assert draft.compute_dtype == torch.float32  # on CPU numba's kernels read int8 weights with float32 activations
    ids = [5, 6, 7, 8, 9]
    rows = RowModel(draft.model, dtype=draft.compute_dtype, prefill_chunk=8)
    rows.add("r", active=True)
    q = rows.prefill("r", ids).softmax(-1)
    p = stock_logits(model, ids)[-1].softmax(-1)
    assert 0.5 * (q - p).abs().sum() < 0.1  # a close draft, not the target itself
    assert use_weight_only_int8(draft.model) == 0  # nothing left to convert
