"""The int8 arithmetic (`native/csrc/int8.cpp`, `--arithmetic int8`): each token's activations
quantised in blocks of 32 (a K kind's per 256), integer dot products against the GGUF's blocks (held
as tiles of 16 rows, the last of 8 where the rows are 8 more than a multiple of 16), float scaling
and accumulation in one fixed order.

The kernel alone: every path this machine compiles (the portable loops always; AVX2; the VNNI one
where the CPU has it, chosen by its flags) gives bitwise the same projections, and a token the same
sums whatever pass it is in; quantisation rounds ties to even on every path; the sums are within the
int8 arithmetic's error of a float64 product. Tiles are the blocks' bytes rearranged: their values
are the blocks' values. A tiny GGUF model computing in int8: a token's logits are bitwise the same
in a prefill chunk, in passes of 1, 6 or 32 tokens and beside another row, close to the float32
arithmetic's but not equal to them; a prefix-cache hit decodes bitwise as a cold run; every drafter,
either policy, gives `none`'s greedy and seeded-sampled output. The embedded model (slow): int8 by
default, speculation lossless. Choosing it: `arithmetic` is checked, `int8` where it cannot run says
why, and `auto` falls back to float32 there."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from specdraft import LLM, SamplingParams, Settings
from specdraft.backend import RowModel
from specdraft.backend import native as blocks
from specdraft.backend.linear import use_few_rows_linears
from specdraft.backend.numba_layers import MAX_TOKENS, NO_RESIDUAL, NumbaLayers
from specdraft.engine import Engine
from specdraft.runtime import build_runtime
from specdraft.verifier import Verifier
from tests.helpers.tiny import TINY_VOCAB, ToyTokenizer, loaded, make_tiny_model

gguf = pytest.importorskip("gguf")
from tests.helpers.gguf_files import random_blocks, write_gguf  # noqa: E402 (needs gguf)

KINDS = {"Q4_1": blocks.Q4_1, "Q8_0": blocks.Q8_0, "Q5_0": blocks.Q5_0, "IQ4_NL": blocks.IQ4_NL}  # (all: test_block_kinds)
COUNTS = [*range(1, 18), MAX_TOKENS, 40]  # every count a whole tile computes in registers (1 .. 16), and more


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def paths() -> dict[str, blocks.Kernel]:
    """Every build of the kernel this machine runs: portable always, AVX2, the native one (VNNI where
    the CPU has it) and that in 256-bit registers only where it has AVX2."""
    built = {"portable": blocks.kernel("portable")}
    if blocks.kernel().avx2:
        built.update(avx2=blocks.kernel("avx2"), ymm=blocks.kernel("ymm"), native=blocks.kernel())
    return built


def int8(kernel: blocks.Kernel, tiles, kind, x, bias, residual=NO_RESIDUAL) -> np.ndarray:
    y = np.full((x.shape[0], tiles.shape[0]), np.nan, np.float32)
    blocks.project_native((tiles, np.zeros(0, np.float32), bias, kind), x, y, residual, kernel.calls("int8"))
    return y


def activations(rng, n: int, width: int) -> np.ndarray:
    """Tokens of several scales, one block all zeros, one holding quantisation ties."""
    x = (rng.standard_normal((n, width)) * rng.choice([1e-3, 1.0, 30.0], size=(n, 1))).astype(np.float32)
    x[0, :32] = 0.0
    if width >= 64:  # max 127 / 4: d = 1 / 4 exactly, and x * (1 / d) = k + 0.5, ties
        x[-1, 32:64] = (np.concatenate([[127.0], np.arange(31) - 15.5]) / 4).astype(np.float32)
    return x


@pytest.mark.compiles
def test_the_native_build_runs_the_best_code_this_cpu_has():
    flags, code = cpu_flags(), blocks.kernel().code
    if {"avx512_vnni", "avx512vl", "avx512f", "avx512bw"} <= flags:
        assert code == "avx2+avx512-vnni+zmm" and blocks.kernel("ymm").code == "avx2+avx512-vnni"
    elif {"avx512_vnni", "avx512vl"} <= flags:
        assert code == "avx2+avx512-vnni"
    elif "avx_vnni" in flags:
        assert code == "avx2+avx-vnni"
    elif {"avx2", "fma", "f16c"} <= flags:
        assert code == "avx2"
    assert blocks.kernel("avx2").code in ("avx2", "portable") and blocks.kernel("portable").code == "portable"


@pytest.mark.compiles
@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
@pytest.mark.parametrize("rows,width", [(8, 32), (40, 64), (96, 576), (24, 1536)])
def test_every_path_gives_bitwise_the_same_sums_and_a_token_the_same_in_every_pass(kind, rows, width):
    rng = np.random.default_rng(rows + width + kind)
    w = random_blocks(rng, kind, rows, width)
    dense = blocks.dequantize(torch.from_numpy(w), kind, width).numpy().astype(np.float64)
    bias = rng.standard_normal(rows).astype(np.float32)
    built = paths()
    tiles = built["portable"].tile(w, kind)
    for kernel in built.values():
        assert np.array_equal(kernel.tile(w, kind), tiles)
    for n in COUNTS:
        x = activations(rng, n, width)
        residual = rng.standard_normal((n, rows)).astype(np.float32)
        want = int8(built["portable"], tiles, kind, x, bias, residual)
        for name, kernel in built.items():
            assert np.array_equal(int8(kernel, tiles, kind, x, bias, residual), want), f"{name}, {n} tokens"
            alone = int8(kernel, tiles, kind, x[-1:].copy(), bias, residual[-1:].copy())
            assert np.array_equal(alone[0], want[-1]), f"{name}: the last of {n} tokens alone"
        exact = x.astype(np.float64) @ dense.T + bias + residual
        scale = np.abs(x).reshape(n, -1, 32).max(axis=2).repeat(32, axis=1) / 127  # each value's quantisation step
        bound = 0.5 * scale @ np.abs(dense.T) + 1e-5 * (np.abs(x) @ np.abs(dense.T) + np.abs(bias) + np.abs(residual))
        assert np.all(np.abs(want - exact) <= bound), f"{n} tokens: beyond the quantisation's error"


@pytest.mark.compiles
def test_quantisation_rounds_ties_to_even_on_every_path():
    # A Q8_0 weight whose row j is 1 at element j (d = 1): y[j] = the quantised x[j] times d_x = 1.
    block = np.zeros((32, 34), np.uint8)
    block[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    block[np.arange(32), 2 + np.arange(32)] = 1
    x = np.zeros((1, 32), np.float32)
    x[0, :11] = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 3.49, 126.5, -127.0, 125.5]  # max 127: d = 1
    want = np.zeros(32, np.float32)
    want[:11] = [127, 2, -2, 0, 0, 2, -2, 3, 126, -127, 126]
    for name, kernel in paths().items():
        got = int8(kernel, kernel.tile(block, blocks.Q8_0), blocks.Q8_0, x, np.zeros(32, np.float32))
        assert np.array_equal(got[0], want), name


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
@pytest.mark.parametrize("rows", [48, 40])  # whole tiles of 16; and a last tile of 8
def test_tiles_hold_the_blocks_values(kind, rows):
    rng = np.random.default_rng(kind)
    w = random_blocks(rng, kind, rows, 96)
    kernel = blocks.kernel()
    tiles = kernel.tile(w, kind)
    assert tiles.shape == w.shape and not np.array_equal(tiles, w)
    want = blocks.dequantize(torch.from_numpy(w), kind, 96).numpy()
    assert np.array_equal(kernel.tile_values(tiles, kind, 96, np.arange(rows)), want)
    ids = np.array([rows - 1, 0, 9, 9])
    assert np.array_equal(kernel.tile_values(tiles, kind, 96, ids), want[ids])


# -- a tiny GGUF model computing in int8 ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(float32, int8): a tiny Llama reading a Q4_1/Q8_0 GGUF's blocks, in each arithmetic."""
    dense = make_tiny_model(seed=41, dtype=torch.float32, layers=2, sharpen=12.0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(dense, path)
    use_few_rows_linears(dense)
    native = copy.deepcopy(dense)
    blocks.use_gguf_blocks(native, path)
    quantized = copy.deepcopy(native)
    assert blocks.use_arithmetic(quantized, "int8") == 2 * 7 + 1
    return native, quantized


def test_tiling_keeps_every_layers_values_and_the_embedding_reads_them(tiny):
    native, quantized = tiny
    for name, module in quantized.named_modules():
        if isinstance(module, blocks.BlockLinear):
            assert module.arithmetic == "int8"
            assert torch.equal(module.dense(), native.get_submodule(name).dense()), name
    ids = torch.tensor([[3, 95, 0, 3]])
    assert torch.equal(quantized.model.embed_tokens(ids), native.model.embed_tokens(ids))
    with pytest.raises(ValueError, match="tiled for the int8 arithmetic once"):
        blocks.use_arithmetic(copy.deepcopy(quantized), "float32")


def logits_by_passes(model, ids: list[int], counts: list[int]) -> torch.Tensor:
    """Every token's logits [len(ids), vocab] when `ids` is fed in passes of `counts` tokens."""
    rows = RowModel(model, compiled=True)
    assert isinstance(rows.compiled_layers, NumbaLayers) and rows.compiled_tokens == MAX_TOKENS
    rows.add("r", active=True)
    out, start = [], 0
    for n in counts:
        out.append(rows.forward(rows.active_window, [ids[start : start + n]])[0].clone())
        rows.commit(rows.active_window, [n])
        start += n
    return torch.cat(out)


def test_a_tokens_logits_are_bitwise_the_same_in_every_pass(tiny):
    native, quantized = tiny
    ids = np.random.default_rng(5).integers(0, TINY_VOCAB, 90).tolist()
    want = logits_by_passes(quantized, ids, [90])  # one prefill chunk: in calls of MAX_TOKENS tokens
    for counts in ([1] * 90, [6] * 15, [MAX_TOKENS, MAX_TOKENS, 26], [3, 40, 1, 46]):
        assert torch.equal(logits_by_passes(quantized, ids, counts), want), counts
    floats = logits_by_passes(native, ids, [90])
    assert not torch.equal(floats, want)  # another arithmetic
    torch.testing.assert_close(want, floats, rtol=0, atol=0.05 * float(floats.abs().max()))


def test_a_kept_vocabulary_reads_the_output_layers_first_rows_and_gives_their_logits_bitwise(tiny):
    """`keep_vocabulary`'s first rows, and `also_rows`'s blocks of 16 beside them, each logit the whole
    layer's bitwise, -inf elsewhere."""
    ids = [3, 95, 0, 3, 17, 42]
    for model in tiny:  # float32 on the blocks, int8 on the tiles
        want = logits_by_passes(model, ids, [6])
        rows = RowModel(model, compiled=True)
        rows.keep_vocabulary(48)
        rows.add("r", active=True)
        got = rows.forward(rows.active_window, [ids])[0]
        assert torch.equal(got[:, :48], want[:, :48]) and bool((got[:, 48:] == float("-inf")).all())
        rows.also_rows(np.array([70, 3, 71, TINY_VOCAB + 5]))  # block 4 beside the first 48 ids
        rows.truncate("r", 0)
        got = rows.forward(rows.active_window, [ids])[0]
        computed = np.r_[0:48, 64:80]
        assert torch.equal(got[:, computed], want[:, computed])
        assert bool((np.delete(got.numpy(), computed, axis=1) == float("-inf")).all())
        for tokens in (40, 0, TINY_VOCAB + 16):
            with pytest.raises(ValueError, match="multiple of 16"):
                rows.keep_vocabulary(tokens)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_a_projection_is_bitwise_the_same_on_any_calling_thread(kind):
    """The server steps on a thread of its own. Each call quantises its tokens into arrays the
    parallel loop then reads by address: they must live until it ends (once they did not, and on a
    thread other than the main one the freed memory was reused at once: wrong logits)."""
    rng = np.random.default_rng(9)
    tiles = blocks.kernel().tile(random_blocks(rng, kind, 96, 576), kind)
    bias = np.zeros(96, np.float32)
    x = activations(rng, 6, 576)
    want = int8(blocks.kernel(), tiles, kind, x, bias)
    got = {}
    for i in range(3):
        thread = threading.Thread(target=lambda i=i: got.__setitem__(i, int8(blocks.kernel(), tiles, kind, x, bias)))
        thread.start()
        thread.join()
    assert all(np.array_equal(y, want) for y in got.values())


def test_a_rows_logits_are_bitwise_the_same_beside_another_row(tiny):
    _, quantized = tiny
    rng = np.random.default_rng(6)
    a, b = rng.integers(0, TINY_VOCAB, 20).tolist(), rng.integers(0, TINY_VOCAB, 20).tolist()
    rows = RowModel(quantized, compiled=True)
    for name, prompt in (("a", a[:12]), ("b", b[:12])):
        rows.add(name, active=True)
        rows.prefill(name, prompt)
    together = rows.forward(rows.active_window, [a[12:18], b[12:18]])  # both rows in one pass of 6
    for i, prompt in enumerate((a, b)):
        alone = logits_by_passes(quantized, prompt[:18], [12, 6])[12:]
        assert torch.equal(together[i], alone), f"row {i}"


def conversation(engine: Engine, params: SamplingParams) -> list[tuple]:
    """Three turns, each prompt the last one, its reply and a new message: (output, logprobs, cached)."""
    rng = np.random.default_rng(0)
    prompt, out = rng.integers(3, 90, 24).tolist(), []
    for _ in range(3):
        [done] = engine.run([(prompt, params, None)])
        out.append((done.token_ids, [t.logprob for t in done.logprobs], done.metrics.cached_tokens))
        prompt = prompt + done.token_ids + rng.integers(3, 90, 7).tolist()
    return out


def test_a_prefix_cache_hit_decodes_bitwise_as_a_cold_run(tiny):
    _, quantized = tiny
    params = SamplingParams(max_tokens=12, logprobs=0)
    drafters = build_runtime(loaded(quantized), Settings(drafters=["none"], calibrate=False)).engine.drafters
    cold = conversation(Engine(Verifier(quantized, compiled=True), drafters, ToyTokenizer(), (), 256, calibrate=False),
                        params)
    warm = conversation(Engine(Verifier(quantized, compiled=True, prefix_cache_bytes=1 << 20), drafters,
                               ToyTokenizer(), (), 256, calibrate=False), params)
    assert [c for _, _, c in cold] == [0, 0, 0] and warm[2][2] > 0
    assert [(o, p) for o, p, _ in warm] == [(o, p) for o, p, _ in cold]  # the log-probabilities too, bitwise


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_every_drafter_gives_nones_output_greedy_and_seeded(tiny, policy):
    _, quantized = tiny
    target = loaded(quantized)
    prompts = [np.random.default_rng(i).integers(3, 90, 16).tolist() * 2 for i in range(3)]  # repeats: n-grams hit
    for params in (SamplingParams(max_tokens=24, temperature=0), SamplingParams(max_tokens=24, temperature=0.8, seed=7)):
        runs = {}
        for drafter in ("none", "ngram", "model", "hybrid"):
            llm = LLM(target, drafter=drafter, k=4, policy=policy, calibrate=policy == "auto")
            runs[drafter] = [c.token_ids for c in llm.generate(prompts, params)]
        for drafter, outputs in runs.items():
            assert outputs == runs["none"], (drafter, params.temperature)


# -- the embedded model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_embedded_model_computes_in_int8_by_default_and_speculation_is_lossless(embedded_int8):
    from specdraft.models import load_model

    default = load_model(None, device="cpu", dtype="float32")
    assert default.arithmetic == "int8" and embedded_int8.arithmetic == "int8" and default.weights == "native"
    prompts = ["Write a Python function that returns the squares of a list of numbers.",
               'Reply with JSON: {"name": ..., "age": ...} for a person called Ada, 36.']
    params = SamplingParams(max_tokens=48, temperature=0)
    runs = {drafter: [c.token_ids for c in LLM(embedded_int8, drafter=drafter, policy="fixed").generate(prompts, params)]
            for drafter in ("none", "ngram", "model", "hybrid")}
    for drafter, outputs in runs.items():
        assert outputs == runs["none"], drafter


# -- choosing it -------------------------------------------------------------------------------------


def test_the_arithmetic_is_checked_and_int8_where_it_cannot_run_says_why(tmp_path):
    from specdraft.models import plan_load

    with pytest.raises(ValueError, match="arithmetic must be one of auto, int8, float32, got 'int4'"):
        Settings(arithmetic="int4")
    with pytest.raises(ValueError, match="arithmetic int8 computes on native weights .* not with weights dense"):
        Settings(arithmetic="int8", weights="dense")
    with pytest.raises(ValueError, match="not with enforce_eager"):
        Settings(arithmetic="int8", enforce_eager=True)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # a Hugging Face directory: dense weights
    assert plan_load(str(tmp_path / "hf"), "cpu").arithmetic == "float32"
    with pytest.raises(ValueError, match="--arithmetic int8 computes on a GGUF's blocks read natively: "
                                         "the model is not a GGUF file"):
        plan_load(str(tmp_path / "hf"), "cpu", arithmetic="int8")
    odd = make_tiny_model(seed=3, dtype=torch.float32, layers=1, vocab_size=TINY_VOCAB + 4)  # 100 output rows
    path = tmp_path / "odd.gguf"
    write_gguf(odd, path)
    blocks.use_gguf_blocks(odd, path)
    assert blocks.int8_problem(odd) == "a layer has 100 output rows, not a multiple of 8"
    with pytest.raises(ValueError, match="the int8 arithmetic cannot run here: a layer has 100 output rows"):
        blocks.use_arithmetic(odd, "int8")


@pytest.mark.subprocess
def test_the_cli_refuses_an_unknown_arithmetic_by_name():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "specdraft.api.cli", "generate", "hi", "--arithmetic", "int4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--arithmetic: invalid choice: 'int4'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_memory_freed_while_building_goes_back_to_the_system():
    from specdraft.models import release_freed_memory

    assert release_freed_memory() is (Path("/proc").is_dir() and __import__("platform").libc_ver()[0] == "glibc")
