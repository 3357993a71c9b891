"""`FewRowsLinear` computes what `nn.Linear` computes, for every row count, and the swap keeps the
model's parameters, state-dict keys and greedy output."""

from __future__ import annotations

import pytest
import torch

from specdraft.engine import Engine
from specdraft.params import SamplingParams
from specdraft.verifier import Verifier
from specdraft.backend.linear import MAX_ROWS, FewRowsLinear, use_few_rows_linears
from tests.helpers.tiny import ScriptedDrafter, ToyTokenizer, make_tiny_model, oracle_script
from tests.helpers.prompts import PROMPTS


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 1), (2, 7), (1, MAX_ROWS + 1), (4, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_nn_linear(shape, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=bias).double()
    x = torch.randn(*shape, 24, dtype=torch.float64)
    out = FewRowsLinear(linear)(x)
    assert out.shape == (*shape, 40) and out.is_contiguous()
    torch.testing.assert_close(out, linear(x), rtol=1e-12, atol=1e-12)


def test_swap_keeps_parameters_and_state_dict():
    model = make_tiny_model(seed=3)
    before = model.state_dict()
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert use_few_rows_linears(model) == linears > 0
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(after[key].data_ptr() == before[key].data_ptr() for key in before)  # shared, not copied


def test_swapped_model_decodes_like_the_stock_model(references):
    model = make_tiny_model()  # the same weights as the `tiny_model` the references come from
    use_few_rows_linears(model)
    drafter = ScriptedDrafter(oracle_script(references, lambda s, i: i == 2))  # verify steps of every width
    engine = Engine(Verifier(model), {"test": drafter}, ToyTokenizer(), (), 256, k=4, max_batch=4, policy="fixed")
    done = engine.run([(p, SamplingParams(max_tokens=40)) for p in PROMPTS])
    for prompt, completion in zip(PROMPTS, done):
        assert completion.token_ids == references[tuple(prompt)]
