"""Native weights (`specdraft.backend.native`): a GGUF's Q4_1/Q8_0 blocks read in place give bitwise
the logits of their dense float32 copy.

The kernel states its kinds, their sizes and its `Projection` as Python does. One function says which
code reads weights (`blocks.reader`): the kernel for float32 rows and blocks where it compiles, else
numba's loops for all-float32 or all-int8 weights, else torch; without the kernel, blocks dequantise
by torch and `native` says why not. The kernel alone: for every token count, blocks and their
dequantised float32 rows give bitwise the same projections (biases, residuals, odd rows, a row tail
past the last 8 lanes); a token's sums do not depend on the pass it is in; the AVX2 code equals the
portable loops; both are within float rounding of a float64 product. Dequantising (torch, the
kernel, and gguf's own reference) gives the same values. A tiny random Llama written as a Q4_1/Q8_0
GGUF file (q/k rows permuted as llama.cpp writes them) and read back: its logits equal the dense
model's bitwise for passes of 1, 6, 32 tokens and a prefill chunk; its greedy continuation is Hugging
Face `generate`'s. The embedded model (slow: loaded twice, native and dense): every linear swapped,
the blocks' values are transformers' dense weights, the same passes bitwise equal, and a fifth of
the bytes. Loading: `weights` is checked, and `native` where it cannot be says why."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft.backend import RowModel
from specdraft.backend import native as blocks
from specdraft.backend.native import Reader, Storage
from specdraft.backend.native import library as cpp_kernel
from specdraft.backend.linear import use_few_rows_linears
from specdraft.backend.numba_layers import MAX_TOKENS, NO_RESIDUAL, project
from tests.helpers.tiny import hf_greedy, make_tiny_model
from tests.helpers.passes import pass_logits

gguf = pytest.importorskip("gguf")
from tests.helpers.gguf_files import random_blocks, write_gguf  # noqa: E402 (needs gguf)

KINDS = {"Q4_0": blocks.Q4_0, "Q4_1": blocks.Q4_1, "Q8_0": blocks.Q8_0, "Q5_0": blocks.Q5_0,
         "Q5_1": blocks.Q5_1, "IQ4_NL": blocks.IQ4_NL}  # the kinds of 32 weights (every kind: test_block_kinds)
COUNTS = [1, 2, 3, 5, 6, 7, 13, MAX_TOKENS]


def run(kernel: int, weights: tuple, x: np.ndarray, residual: np.ndarray = NO_RESIDUAL) -> np.ndarray:
    y = np.empty((x.shape[0], weights[0].shape[0]), np.float32)
    project(weights, x, y, residual, kernel)
    return y


@pytest.mark.compiles
def test_the_kernel_states_the_kinds_their_sizes_and_its_structs_as_python_does():
    compiled = blocks.kernel()
    stated = {kind: compiled.kind(kind) for kind in range(len(blocks.NAMES) + 1)}  # and one number past them
    assert stated == {**{kind: (name, *blocks.unit(kind)) for kind, name in blocks.NAMES.items()},
                      len(blocks.NAMES): None}
    fields = blocks.Projection._fields
    assert [compiled.offset(field) for field in fields] == [8 * i for i in range(len(fields))]
    assert compiled.offset(None) == 8 * len(fields) and compiled.offset("nothing") == -1
    fields = blocks.Attention._fields
    assert [compiled.offset(field, "attention") for field in fields] == [8 * i for i in range(len(fields))]
    assert compiled.offset(None, "attention") == 8 * len(fields) and compiled.offset("nothing", "attention") == -1
    # how many queries an attention job takes, so how many jobs a layer has: every build counts as numba does
    for path in blocks.PATHS:
        assert [blocks.kernel(path).job_queries(q) for q in range(1, 40)] == [blocks.job_queries(q) for q in range(1, 40)]
    assert [blocks.job_queries(q) for q in (1, 2, 3, 6, 12, 13)] == [1, 1, 2, 3, 6, blocks.MAX_JOB_QUERIES]


CPU, CUDA = torch.device("cpu"), torch.device("cuda")
FLOAT32, BLOCKS, INT8, OTHER = Storage.FLOAT32, Storage.BLOCKS, Storage.INT8, Storage.OTHER
READERS = [  # (stored, device, the reader with the kernel, without it)
    ({FLOAT32}, CPU, Reader.KERNEL, Reader.NUMBA),
    ({BLOCKS}, CPU, Reader.KERNEL, Reader.TORCH),
    ({FLOAT32, BLOCKS}, CPU, Reader.KERNEL, Reader.TORCH),
    ({INT8}, CPU, Reader.NUMBA, Reader.NUMBA),
    ({FLOAT32, INT8}, CPU, Reader.TORCH, Reader.TORCH),
    ({BLOCKS, INT8}, CPU, Reader.TORCH, Reader.TORCH),
    ({FLOAT32, OTHER}, CPU, Reader.TORCH, Reader.TORCH),
    (set(), CPU, Reader.TORCH, Reader.TORCH),
    ({FLOAT32}, CUDA, Reader.TORCH, Reader.TORCH),
    ({BLOCKS}, CUDA, Reader.TORCH, Reader.TORCH),
]


def no_kernel():
    raise RuntimeError("no C++ compiler found")


@pytest.mark.parametrize("stored, device, with_kernel, without", READERS)
def test_one_function_says_which_code_reads_weights(stored, device, with_kernel, without, monkeypatch):
    assert blocks.reader(stored, device) is with_kernel
    monkeypatch.setattr(cpp_kernel, "kernel", no_kernel)
    assert blocks.reader(stored, device) is without


def test_without_the_kernel_blocks_dequantise_by_torch_and_native_weights_say_why(monkeypatch):
    from specdraft.models import native_problem

    w = torch.from_numpy(random_blocks(np.random.default_rng(4), blocks.Q4_1, 5, 64))
    monkeypatch.setattr(cpp_kernel, "kernel", no_kernel)
    assert torch.equal(blocks.dense_values(w, blocks.Q4_1, 64), blocks.dequantize(w, blocks.Q4_1, 64))
    assert "the block kernel is not available here: no C++ compiler found" in native_problem(Path("m.gguf"), CPU, torch.float32)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
@pytest.mark.parametrize("rows,width", [(37, 64), (100, 576), (19, 1536)])
def test_blocks_and_their_dense_rows_give_bitwise_the_same_projection_for_every_token_count(kind, rows, width):
    rng = np.random.default_rng(rows + width + kind)
    w = random_blocks(rng, kind, rows, width)
    dense = blocks.dequantize(torch.from_numpy(w), kind, width).numpy()
    bias = rng.standard_normal(rows).astype(np.float32)
    address = blocks.kernel().calls()
    native_weights = (w, np.zeros(0, np.float32), bias, kind)
    dense_weights = (dense.view(np.uint8), np.zeros(0, np.float32), bias, blocks.F32)
    for n in COUNTS:
        x = rng.standard_normal((n, width)).astype(np.float32)
        residual = rng.standard_normal((n, rows)).astype(np.float32)
        got = run(address, native_weights, x, residual)
        assert np.array_equal(got, run(address, dense_weights, x, residual)), f"{n} tokens"
        alone = run(address, native_weights, x[-1:].copy(), residual[-1:].copy())
        assert np.array_equal(alone[0], got[-1]), f"the last of {n} tokens alone"
        want = x.astype(np.float64) @ dense.T.astype(np.float64) + bias + residual
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.sqrt(width))


@pytest.mark.compiles
@pytest.mark.parametrize("kind", [blocks.F32, *KINDS.values()], ids=["F32", *KINDS])
def test_the_avx2_code_and_the_portable_loops_give_the_same_sums(kind):
    fast, portable = blocks.kernel(), blocks.kernel("portable")
    if not fast.avx2:
        pytest.skip("this machine compiles the portable loops only")
    rng = np.random.default_rng(kind)
    width = 200 if kind == blocks.F32 else 576  # a float32 row with a tail past its last 8 lanes
    w = (rng.standard_normal((45, width)).astype(np.float32).view(np.uint8) if kind == blocks.F32
         else random_blocks(rng, kind, 45, width))
    weights = (w, np.zeros(0, np.float32), np.zeros(45, np.float32), kind)
    for n in (1, 4, 6, 11):
        x = rng.standard_normal((n, width)).astype(np.float32)
        assert np.array_equal(run(fast.calls(), weights, x), run(portable.calls(), weights, x)), f"{n} tokens"


@pytest.mark.compiles
@pytest.mark.parametrize("name", list(KINDS))
def test_dequantising_by_torch_by_the_kernel_and_by_gguf_gives_the_same_values(name):
    kind = KINDS[name]
    w = random_blocks(np.random.default_rng(3), kind, 70, 96)
    reference = gguf.quants.dequantize(w, getattr(gguf.GGMLQuantizationType, name))  # [70, 96] float32
    assert np.array_equal(blocks.dequantize(torch.from_numpy(w), kind, 96).numpy(), reference)
    assert np.array_equal(blocks.dense_values(torch.from_numpy(w), kind, 96).numpy(), reference)


# -- a tiny random model written as a GGUF --------------------------------------------------------


@pytest.fixture(scope="module", params=["Q4_1", "Q4_0", "Q5_1", "IQ4_NL"])
def tiny_pair(request, tmp_path_factory):
    """(dense, native): a tiny float32 Llama holding the values of a GGUF of projections of one kind (the
    param) and a Q8_0 embedding and output layer, and a copy reading the file's blocks."""
    dense = make_tiny_model(seed=31, dtype=torch.float32, layers=2)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(dense, path, projection_type=request.param)
    use_few_rows_linears(dense)  # as the loader builds a model on CPU
    native = copy.deepcopy(dense)
    assert blocks.use_gguf_blocks(native, path) == 2 + 7 * 2
    return dense, native


def test_a_tiny_gguf_model_reads_its_blocks_and_gives_the_dense_logits_bitwise(tiny_pair):
    dense, native = tiny_pair
    assert isinstance(native.model.layers[0].self_attn.q_proj, blocks.BlockLinear)
    kind = native.model.layers[0].mlp.down_proj.kind
    assert blocks.NAMES[kind] in ("Q4_1", "Q4_0", "Q5_1", "IQ4_NL") and native.lm_head.kind == blocks.Q8_0
    assert isinstance(native.model.embed_tokens, blocks.BlockEmbedding)
    for name, module in native.named_modules():
        if isinstance(module, blocks.BlockLinear):
            assert torch.equal(module.dense(), dense.get_submodule(name).weight), name
    prompt = list(range(1, 2 * MAX_TOKENS + 9))  # a prefill chunk of 72 tokens
    counts = [1, 6, MAX_TOKENS, 1, 3]
    for n, got, want in zip(["prefill", *counts], pass_logits(native, prompt, counts), pass_logits(dense, prompt, counts)):
        assert torch.equal(got, want), f"a pass of {n}"


def test_a_tiny_gguf_model_continues_greedily_as_hugging_face_generate(tiny_pair):
    dense, native = tiny_pair
    prompt = list(range(5, 30))
    rows = RowModel(native, compiled=True)
    rows.add("r", active=True)
    token = int(rows.prefill("r", prompt).argmax())
    out = [token]
    for _ in range(30):
        token = int(rows.forward(rows.active_window, [[token]])[0, -1].argmax())
        rows.commit(rows.active_window, [1])
        out.append(token)
    assert out == hf_greedy(dense, prompt, 31)


# -- the embedded model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_dense():
    from specdraft.models import load_model

    return load_model(None, device="cpu", dtype="float32", weights="dense")


@pytest.mark.slow
def test_the_embedded_model_reads_every_projection_as_blocks_holding_the_dense_values(embedded, embedded_dense):
    assert embedded.weights == "native" and embedded_dense.weights == "dense"
    model = embedded.model
    swapped = {name: m for name, m in model.named_modules() if isinstance(m, blocks.BlockLinear)}
    assert len(swapped) == 7 * len(model.model.layers) + 1  # every projection and the (tied) output layer
    assert model.lm_head.kind == blocks.Q8_0 and model.lm_head.blocks is model.model.embed_tokens.blocks
    for name, module in swapped.items():
        assert torch.equal(module.dense(), embedded_dense.model.get_submodule(name).weight), name
    stored = {t.data_ptr(): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    assert sum(stored.values()) < 100e6  # 96.6 MB of blocks and norms, against 538 MB dense


@pytest.mark.slow
def test_the_embedded_model_gives_the_dense_logits_bitwise_for_every_pass(embedded, embedded_dense):
    prompt = embedded.tokenizer.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * 3)
    assert len(prompt) > MAX_TOKENS
    counts = [1, 6, MAX_TOKENS, 2]
    for n, got, want in zip(["prefill", *counts], pass_logits(embedded.model, prompt, counts),
                            pass_logits(embedded_dense.model, prompt, counts)):
        assert torch.equal(got, want), f"a pass of {n}"


def test_weights_are_checked_and_native_where_it_cannot_be_says_why(tmp_path):
    from specdraft.models import load_model, plan_load

    gguf = tmp_path / "m.gguf"
    gguf.touch()
    with pytest.raises(ValueError, match="weights must be one of auto, native, dense, got 'int4'"):
        plan_load(str(gguf), "cpu", weights="int4")
    with pytest.raises(ValueError, match="compute in float32, not bfloat16"):
        plan_load(str(gguf), "cpu", "bfloat16", weights="native")
    assert plan_load(str(gguf), "cpu", "bfloat16").weights == "dense"
    assert plan_load(str(gguf), "cpu", weights="dense").weights == "dense"
    (tmp_path / "config.json").write_text("{}")  # a Hugging Face directory, refused before anything loads
    with pytest.raises(ValueError, match="--weights native: the model is not a GGUF file"):
        load_model(str(tmp_path), weights="native")


@pytest.mark.slow
def test_the_default_self_draft_says_plainly_when_it_reads_more_than_a_native_target(embedded, embedded_dense, caplog):
    from specdraft.models.find import SELF_DRAFT
    from specdraft.models import linear_bytes, load_draft

    with caplog.at_level("WARNING", logger="specdraft"):
        draft = load_draft(SELF_DRAFT, embedded)
    assert linear_bytes(draft.model) > linear_bytes(embedded.model)  # 135 MB of int8 against 96 MB of blocks
    assert "cannot be cheaper than the target" in caplog.text and "native weights" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="specdraft"):
        load_draft(SELF_DRAFT, embedded_dense)  # a quarter of a float32 target's bytes: no warning
    assert "cannot be cheaper" not in caplog.text


@pytest.mark.slow
def test_native_weights_load_without_a_float32_copy_of_the_blocks(embedded_dense, monkeypatch):
    from specdraft.models import loader

    def dense_load(*args, **kwargs):
        raise AssertionError("the float32 model was loaded whole")

    monkeypatch.setattr(loader, "_from_pretrained", dense_load)
    loaded = loader.load_model(None, device="cpu", dtype="float32", arithmetic="float32")
    assert loaded.weights == "native"
    dense = dict(embedded_dense.model.named_parameters())
    for name, tensor in loaded.model.named_parameters():  # what is left: the norms, each as the dense model holds it
        assert "norm" in name and torch.equal(tensor, dense[name]), name
    assert loaded.eos_token_ids == embedded_dense.eos_token_ids and loaded.max_context == embedded_dense.max_context
