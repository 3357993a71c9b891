"""Phi-3 in our forward, a family as a row (`specdraft.backend.family.FAMILIES`): q/k/v and gate/up
held fused by its model (and its files), split on loading into the modules every path reads
(`models.fused.unfuse`), the fused ones left as `Joined`s of them for the stock forward. A tiny
random Phi-3 built in-process: split, the stock forward gives the fused model's logits bitwise; our
forward gives the stock model's across rows and packed passes; numba's compiled layers equal the
eager ones for every token count; verify passes equal plain steps bitwise; greedy speculative output
equals plain greedy and Hugging Face `generate`'s. Its 128k models' LongRoPE, fixed by the context served,
is transformers' rotation for that context; a rotary embedding over part of each head (Phi-4-mini's) runs
every CPU path. One over part of a pair of dimensions, or one switched by each pass's length (dynamic NTK),
is refused by name. Files written by
llama.cpp's converter: `tests/models/test_converted_files.py`."""

from __future__ import annotations

import pytest
import torch

from specdraft.backend import forward
from specdraft.backend.family import family_of, family_problem
from specdraft.models.fused import Joined, unfuse
from tests.helpers.families import make_tiny_phi3
from tests.helpers.family_checks import (greedy_equals_plain_and_hugging_face, numba_equals_eager,
                                         own_forward_equals_stock, verify_passes_equal_plain_steps)
from tests.helpers.passes import stock_logits


def test_a_phi3_config_is_described_by_its_row_and_split_by_it():
    fused = make_tiny_phi3(unfused=False)
    family = family_of(fused.config)
    assert (family.model_type, family.shape, family.tied_head, family.qkv_bias) == ("phi3", (4, 2, 16), False, False)
    assert [(f.module, f.parts) for f in family.fused] == [("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                                           ("mlp.gate_up_proj", ("gate_proj", "up_proj"))]
    assert not forward.supports(fused)  # its parts are not modules of their own until split
    weight = fused.model.layers[1].self_attn.qkv_proj.weight
    assert unfuse(fused, family) == 2 * 2 and unfuse(fused, family) == 0  # twice: nothing more to split
    attention, mlp = fused.model.layers[1].self_attn, fused.model.layers[1].mlp
    assert [attention.q_proj.out_features, attention.k_proj.out_features, mlp.up_proj.out_features] == [64, 32, 128]
    assert attention.v_proj.weight.data_ptr() == weight[96:].data_ptr()  # views of the fused rows, no copy
    assert isinstance(attention.qkv_proj, Joined) and not list(attention.qkv_proj.parameters())
    assert forward.supports(fused)


def test_the_stock_forward_gives_the_fused_models_logits_bitwise_once_split():
    ids = list(range(3, 40))
    assert torch.equal(stock_logits(make_tiny_phi3(seed=2), ids), stock_logits(make_tiny_phi3(seed=2, unfused=False), ids))


@pytest.mark.parametrize("rows, parts, tokens", [(9216, (3072, 3072 + 1024), 1), (9216, (3072, 3072 + 1024), 6),
                                                 (16384, (8192,), 300)])
def test_at_phi3_minis_shapes_its_parts_give_the_fused_projections_outputs_bitwise(rows, parts, tokens):
    """What `Joined` relies on for the stock forward: torch's product sums each output alone, whatever the
    rows beside it (Phi-3-mini: 3072 wide; q/k/v 9216 rows, gate/up 16384)."""
    torch.manual_seed(0)
    weight, x = torch.randn(rows, 3072), torch.randn(1, tokens, 3072)
    pieces = torch.tensor_split(weight, parts)
    with torch.no_grad():
        joined = torch.cat([torch.nn.functional.linear(x, piece) for piece in pieces], dim=-1)
        assert torch.equal(joined, torch.nn.functional.linear(x, weight))


def test_a_rotary_embedding_over_part_of_pairs_or_switched_by_each_passs_length_is_refused():
    odd = make_tiny_phi3(unfused=False).config
    odd.rope_parameters["partial_rotary_factor"] = 0.3  # 4.8 of 16 dimensions
    assert family_problem(odd) == ("a rotary embedding over part of each head (partial_rotary_factor 0.3) that is not "
                                   "whole pairs of its 16 dimensions")
    assert family_problem(make_tiny_phi3(partial=0.75).config) is None and family_of(make_tiny_phi3(partial=0.75).config).rotated == 12
    dynamic = make_tiny_phi3(unfused=False).config
    dynamic.rope_parameters["rope_type"] = "dynamic"
    assert family_problem(dynamic) == "rotary frequencies that change with the sequence's length (dynamic)"
    assert family_problem(make_tiny_phi3(long_rope=32).config) is None  # LongRoPE: fixed by the context served


def test_long_rope_is_fixed_by_the_context_served_and_is_transformers_rotation_for_it():
    """LongRoPE's frequencies fixed once (`long_rope.use_context`): within the original context (what a model
    loads with) the short ones, and our forward gives transformers' own model's logits there; serving
    more, the long ones, and a sequence past the original context (which transformers, fed it whole,
    rotates by the long ones) gives its logits too, prefilled in chunks that start within the original."""
    from specdraft.backend import RowModel
    from specdraft.models.long_rope import original_context, use_context

    ours, theirs = make_tiny_phi3(seed=7, long_rope=32), make_tiny_phi3(seed=7, long_rope=32)
    assert original_context(ours.config) == 32 and original_context(make_tiny_phi3().config) is None
    short = [(7 * i + 3) % 90 + 3 for i in range(30)]
    longer = [(5 * i + 1) % 90 + 3 for i in range(45)]
    for context, ids in ((None, short), (256, longer)):
        use_context(ours, context)
        rows = RowModel(ours, prefill_chunk=7)
        rows.add("r", active=True)
        torch.testing.assert_close(rows.prefill("r", ids), stock_logits(theirs, ids)[-1], rtol=0, atol=1e-4)
    rotary = ours.model.rotary_emb
    assert rotary.rope_type == "default" and rotary.attention_scaling == theirs.model.rotary_emb.attention_scaling > 1
    assert torch.equal(rotary.inv_freq, theirs.model.rotary_emb.inv_freq)  # transformers' long ones, after `longer`
    use_context(ours)
    assert not torch.equal(rotary.inv_freq, theirs.model.rotary_emb.inv_freq)  # the short ones again


def test_a_long_rope_model_speculates_as_it_decodes_and_as_hugging_face_within_its_original_context():
    from specdraft.models.long_rope import use_context

    model = make_tiny_phi3(seed=9, long_rope=64)
    use_context(model)  # as the loader fixes it
    verify_passes_equal_plain_steps(model)
    greedy_equals_plain_and_hugging_face(model, [[33, 34, 35, 36] * 4, list(range(1, 20))], tokens=24)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_own_forward_equals_stock_across_rows_and_a_packed_pass(dtype, atol):
    own_forward_equals_stock(make_tiny_phi3(seed=3, dtype=dtype), atol)


def test_numba_passes_equal_the_eager_layers_for_every_token_count():
    numba_equals_eager(make_tiny_phi3(seed=11), atol=2e-5)


def test_the_compiled_steps_verify_passes_equal_its_plain_steps_bitwise():
    verify_passes_equal_plain_steps(make_tiny_phi3(seed=21))


def test_greedy_speculative_output_equals_plain_greedy_and_hugging_face():
    prompts = [[33, 34, 35, 36] * 6, list(range(1, 30)), [5, 17, 42, 9, 9, 13]]
    greedy_equals_plain_and_hugging_face(make_tiny_phi3(seed=5), prompts)


def test_a_runtime_serves_a_long_rope_models_original_context_unless_asked_for_more():
    """The context served decides LongRoPE's factors: the original one by default (the short factors, as
    loaded), a longer one asked for (`max_context`) the long ones; the model's own cut stays."""
    from specdraft.runtime import build_runtime
    from specdraft.settings import Settings
    from tests.helpers.tiny import loaded

    model = make_tiny_phi3(seed=4, long_rope=32)
    short = model.model.rotary_emb.inv_freq.clone()
    contexts = []
    for asked in (None, 400):
        runtime = build_runtime(loaded(model), Settings(device="cpu", max_context=asked, calibrate=False))
        contexts.append((runtime.engine.max_context, torch.equal(model.model.rotary_emb.inv_freq, short)))
    assert contexts == [(32, True), (400, False)]


@pytest.mark.parametrize("partial, long_rope", [(0.5, None), (0.75, 64)])
def test_a_partial_rotary_runs_every_cpu_path_as_the_stock_model(partial, long_rope, monkeypatch):
    """Phi-4-mini's rotary embedding over each head's first part (with LongRoPE, as Phi-4-mini's): our
    forward gives the stock model's logits across rows and packed passes; numba's layers equal the eager
    ones; verify passes equal plain steps bitwise; greedy speculative output equals plain and Hugging
    Face's; inductor's parts (a draft's layers) give the eager layers' logits."""
    from specdraft.models.long_rope import use_context
    from tests.helpers.family_checks import inductor_equals_eager

    model = make_tiny_phi3(seed=13, partial=partial, long_rope=long_rope)
    use_context(model)  # as the loader fixes it
    assert model.model.rotary_emb.inv_freq.shape == (int(16 * partial) // 2,)
    own_forward_equals_stock(model, atol=1e-4)
    numba_equals_eager(model, atol=2e-5)
    verify_passes_equal_plain_steps(model)
    greedy_equals_plain_and_hugging_face(model, [[33, 34, 35, 36] * 4, list(range(1, 20))], tokens=24)
    inductor_equals_eager(model, list(range(3, 30)), monkeypatch)  # last: numba is kept off from here on


def test_the_triton_kernels_refuse_a_partial_rotary_by_name():
    """(Under Triton's interpreter, as the test suite runs on CPU.)"""
    pytest.importorskip("triton")
    from specdraft.backend.triton_layers import unavailable

    model = make_tiny_phi3(partial=0.5)
    why = unavailable(model, list(model.model.layers), torch.float32, family_of(model.config))
    assert why == "the kernels have no rotary embedding over part of a head (8 of 16) yet"
