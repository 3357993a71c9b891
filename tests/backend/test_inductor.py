"""Inductor's compiled CPU layer parts (`specdraft.backend.inductor`, what int8 draft copies and
non-float32 activations run; float32 layers run numba's, `tests/backend/test_numba_layers.py`, hidden here so
that the tiny float32 models exercise inductor's): logits equal the eager layers' for every token
count it takes and the eager layers take the rest; joining the q/k/v and gate/up weights changes no
value and copies nothing twice; a compiler that fails leaves the same output, with a warning."""

from __future__ import annotations

import pytest
import torch

from specdraft.backend import RowModel
from specdraft.backend.family import family_of
from specdraft.backend.inductor import MAX_TOKENS, InductorLayers
from specdraft.backend.weight_only_int8 import use_weight_only_int8
from specdraft.backend.numba_layers import NumbaLayers
from tests.helpers.tiny import make_tiny_model, row_passes

pytestmark = pytest.mark.compiles


@pytest.fixture(autouse=True)
def inductor_parts(monkeypatch):
    """Float32 layers take inductor's parts, as int8 and bf16 ones do."""
    monkeypatch.setattr(NumbaLayers, "applies", staticmethod(lambda *args: False))


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability(), reason="no CPU compiler")
def test_inductor_passes_equal_the_eager_layers_for_every_token_count():
    model = make_tiny_model(seed=5, dtype=torch.float32, layers=2, attention_bias=True)
    counts = [1, 2, 3, 5, 8, MAX_TOKENS + 4, 1]  # every bucket, then the eager layers, then one again
    inductor = RowModel(model, compiled=True)
    assert inductor.compiled_layers is not None
    reference = row_passes(RowModel(model), list(range(1, 30)), counts)
    for n, got, want in zip(counts, row_passes(inductor, list(range(1, 30)), counts), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5, msg=f"a pass of {n} tokens")
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert inductor.compiled_layers.failed is None


def test_joining_projections_keeps_every_value_and_shares_one_buffer():
    model = make_tiny_model(seed=6, dtype=torch.float32, layers=2)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    InductorLayers(model, list(model.model.layers), torch.float32, family_of(model.config))
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q, k, v = attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    ptr = q.data_ptr()
    InductorLayers(model, list(model.model.layers), torch.float32, family_of(model.config))  # joined already: reused, not copied again
    assert attention.q_proj.weight.data_ptr() == ptr


def test_a_failing_compiler_falls_back_to_eager_with_the_same_output():
    model = make_tiny_model(seed=7, dtype=torch.float32, layers=1)
    rows = RowModel(model, compiled=True)
    inductor = rows.compiled_layers

    def broken(*args):
        raise RuntimeError("no compiler here")

    inductor._compiled = [broken] * len(inductor._compiled)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        got = row_passes(rows, [1, 2, 3, 4], [1, 3])
    assert inductor.failed == "RuntimeError: no compiler here"  # later passes run the eager layers
    for a, b in zip(got, row_passes(RowModel(model), [1, 2, 3, 4], [1, 3])):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)  # the same sums, eagerly (another order)


def test_inductor_layers_apply_only_to_plain_float_layers_on_cpu():
    model = make_tiny_model(seed=8, dtype=torch.float32, layers=1)
    layers = list(model.model.layers)
    assert InductorLayers.applies(model, layers, torch.float32)
    assert not InductorLayers.applies(model, layers, torch.int8)  # activations must be floats
    model.config.hidden_act = "gelu"
    assert not InductorLayers.applies(model, layers, torch.float32)
    model.config.hidden_act = "silu"
    use_weight_only_int8(model.model.layers[0].mlp)
    assert not InductorLayers.applies(model, layers, torch.float32)  # int8 and float linears mixed
    use_weight_only_int8(model)
    assert InductorLayers.applies(model, layers, torch.bfloat16)  # all int8: an int8 draft copy


def test_an_int8_draft_copy_runs_inductor_as_its_eager_step():
    """An int8 draft copy run with bf16 activations (the int8 kernel called from the compiled parts;
    with float32 activations numba's kernels take it): its distributions stay as close to the eager
    int8 step's as rounding allows."""
    from specdraft.models import LoadedModel, int8_copy

    target = make_tiny_model(seed=9, dtype=torch.float32, layers=2)
    draft = int8_copy(LoadedModel(target, None, "tiny", None, 256, (), False))
    inductor = RowModel(draft.model, dtype=torch.bfloat16, compiled=True)
    assert isinstance(inductor.compiled_layers, InductorLayers)
    eager = RowModel(draft.model, dtype=torch.bfloat16)
    for got, want in zip(row_passes(inductor, [5, 6, 7, 8, 9], [1, 4, 1]), row_passes(eager, [5, 6, 7, 8, 9], [1, 4, 1])):
        assert 0.5 * (got.softmax(-1) - want.softmax(-1)).abs().sum(-1).max() < 0.02
    assert inductor.compiled_layers.failed is None

