"""One arithmetic per token: a token's logits, and the keys and values it writes, are bitwise the same
whatever pass computes them: a plain step, a verify pass of any width, a prefill chunk, alone or
beside other rows, across a KV-bucket boundary. This is what makes speculation lossless in bf16.

Device-agnostic: on CPU (CI) the Triton kernels run under Triton's interpreter (its products in
float32 numpy: the kernels' tiling, splits and order of sums are what is tested); with
SPECDRAFT_TEST_DEVICE=cuda they run compiled on the GPU, bf16 tensor cores and all."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.helpers.tiny import TEST_DEVICE, TINY_VOCAB, make_tiny_model

assert TEST_DEVICE.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest on CPU
pytest.importorskip("triton")

from specdraft.backend import RowModel, StaticShapes  # noqa: E402
from specdraft.backend import triton_kernels as tk  # noqa: E402
from specdraft.drafters.base import Draft  # noqa: E402
from specdraft.params import SamplingParams  # noqa: E402
from specdraft.verifier import Batch, Verifier  # noqa: E402

DTYPE = torch.bfloat16
LENGTH = 34  # tokens a row is fed: crosses the KV buckets at 16 and 32
STATIC = StaticShapes(max_rows=4, max_context=64, kv_block=16, graphs=True)
SCHEDULES = [  # pass widths that feed a row its LENGTH tokens, and whether other rows share the passes
    ("token by token", [1] * LENGTH, True),
    ("prefill chunk", [LENGTH], False),
    ("prompt, then verify passes of 1..6", [12, 1, 2, 3, 4, 5, 6, 1], True),
    ("uneven", [5, 3, 16, 1, 1, 7, 1], False),
]


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(dtype=DTYPE, layers=2)


def feed(model, widths, static, neighbours: bool, seed: int = 0):
    """Feed row "r" the same LENGTH tokens in passes of `widths` (with `neighbours`, beside two other
    rows of other lengths fed other tokens in the same passes); return its logits [LENGTH, vocab]
    and its cache entries [layers, 2, kv_heads, LENGTH, head_dim]."""
    tokens = np.random.default_rng(seed).integers(0, TINY_VOCAB, size=LENGTH)
    rows = RowModel(model, static=static, kernels="triton")
    ids = ["a", "r", "b"] if neighbours else ["r"]
    others = {"a": np.random.default_rng(1).integers(0, TINY_VOCAB, size=LENGTH + 9),
              "b": np.random.default_rng(2).integers(0, TINY_VOCAB, size=LENGTH + 3)}
    for row_id in ids:
        rows.add(row_id, active=True)
    for row_id, extra in (("a", 9), ("b", 3)):
        if neighbours:  # other rows start ahead of "r", by another number of tokens each
            rows.forward(rows.window_of(row_id), others[row_id][None, :extra])
            rows.commit(rows.window_of(row_id), [extra])
    logits, done = [], 0
    for width in widths:
        batch = np.stack([tokens[done : done + width] if r == "r" else others[r][rows.length(r) : rows.length(r) + width]
                          for r in ids])  # [rows, width]
        out = rows.forward(rows.active_window, batch)  # [rows, width, vocab]
        logits.append(out[ids.index("r")].float().cpu())
        rows.commit(rows.active_window, [width] * len(ids))
        done += width
    assert done == LENGTH
    slot = rows.slot("r")
    cache = torch.stack([torch.stack(rows.cache.entries(layer, slot)) for layer in range(rows.cache.num_layers)])
    return torch.cat(logits), cache.cpu()


def test_a_tokens_logits_and_entries_do_not_depend_on_its_pass(model):
    """At static shapes (what CUDA graphs capture: batch buckets, KV buckets of 16 positions)."""
    reference_logits, reference_cache = feed(model, [1] * LENGTH, STATIC, neighbours=False)
    assert torch.isfinite(reference_logits).all()
    for name, widths, neighbours in SCHEDULES:
        logits, cache = feed(model, widths, STATIC, neighbours)
        where = f"{name}{' beside other rows' if neighbours else ''}"
        assert torch.equal(cache, reference_cache), f"keys/values differ: {where}"
        assert torch.equal(logits, reference_logits), (
            f"logits differ: {where}, first at token {int((logits != reference_logits).any(-1).nonzero()[0])}")


def test_the_kernels_compute_the_models_logits(model):
    """Not bitwise (other roundings than torch's modules), but the same function: close to the
    model's own forward in float64."""
    ids = torch.as_tensor(np.random.default_rng(3).integers(0, TINY_VOCAB, size=(1, LENGTH)), device=TEST_DEVICE)
    logits, _ = feed(model, [LENGTH], STATIC, neighbours=False, seed=3)
    reference = make_tiny_model(dtype=torch.float64, layers=2)
    with torch.inference_mode():
        expected = reference(ids).logits[0].float().cpu()
    scale = expected.abs().max()
    assert (logits - expected).abs().max() < 0.05 * scale
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("rows", [1, 6, 17])
@pytest.mark.parametrize("variant", ["plain", "norm+bias", "act+residual"])
def test_linear_rows_do_not_depend_on_the_row_count(rows, variant, monkeypatch):
    """Split in-features (a weight 1024 wide splits in parts summed by a second kernel), tiles of 16
    rows: row i of a product of n rows equals the product of row i alone. Float32 outputs (as the
    logits are), so that any change in the order of the sums shows."""
    g = torch.Generator().manual_seed(rows)
    n_in, n_out = 1024, 96
    monkeypatch.setattr(tk, "MIN_SPLIT_WEIGHTS", 0)  # split this small weight as a large one is
    weight = (torch.randn(n_out, n_in, generator=g) / 32).to(DTYPE).to(TEST_DEVICE)
    assert tk.tiling(n_out, n_in).splits > 1
    width = 2 * n_in if variant == "act+residual" else n_in
    x = torch.randn(rows, width, generator=g).to(DTYPE).to(TEST_DEVICE)
    kwargs = {"out_dtype": torch.float32}
    bias = None
    if variant == "norm+bias":
        bias = torch.randn(n_out, generator=g).to(DTYPE).to(TEST_DEVICE)
        kwargs["norm"] = (torch.randn(n_in, generator=g).to(DTYPE).to(TEST_DEVICE), 1e-5)
    if variant == "act+residual":
        kwargs.update(act=True, residual=torch.randn(rows, n_out, generator=g).to(DTYPE).to(TEST_DEVICE))
    together = tk.linear(x, weight, bias, **kwargs)
    for i in sorted({0, rows // 2, rows - 1}):
        alone_kwargs = dict(kwargs)
        if "residual" in kwargs:
            alone_kwargs["residual"] = kwargs["residual"][i : i + 1]
        assert torch.equal(tk.linear(x[i : i + 1], weight, bias, **alone_kwargs), together[i : i + 1]), f"row {i} of {rows}"
    h = x.double()
    if variant == "act+residual":
        h = torch.nn.functional.silu(h[:, :n_in]) * h[:, n_in:]
    if "norm" in kwargs:
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * kwargs["norm"][0].double()
    expected = h @ weight.double().T + (0 if bias is None else bias.double()) + kwargs.get("residual", torch.zeros(1, device=TEST_DEVICE)).double()
    assert (together.double() - expected).abs().max() < 0.05 * expected.abs().max()


def test_attention_across_chunks_does_not_depend_on_the_pass():
    """Keys in chunks at fixed offsets (0, 256, ...): tokens at positions 250..269 (across a chunk
    boundary), attended all in one pass, one by one, or beside another row's tokens, agree bitwise,
    and equal softmax attention."""
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim, capacity = 4, 2, 16, 320
    keys = torch.randn(2, kv_heads, capacity, head_dim, generator=g).to(DTYPE).to(TEST_DEVICE)
    values = torch.randn(2, kv_heads, capacity, head_dim, generator=g).to(DTYPE).to(TEST_DEVICE)
    positions = torch.arange(250, 270, dtype=torch.int32, device=TEST_DEVICE)
    q = torch.randn(len(positions), heads * head_dim, generator=g).to(DTYPE).to(TEST_DEVICE)
    slots = torch.ones(len(positions), dtype=torch.int32, device=TEST_DEVICE)
    together = tk.attention(q, keys, values, slots, positions, heads, kv_heads, head_dim)
    mixed = tk.attention(torch.cat([q, q[:3]]), keys, values, torch.cat([slots, slots[:3] * 0]),
                         torch.cat([positions, positions[:3] - 200]), heads, kv_heads, head_dim)
    assert torch.equal(mixed[: len(positions)], together)
    for n in range(len(positions)):
        alone = tk.attention(q[n : n + 1], keys, values, slots[n : n + 1], positions[n : n + 1], heads, kv_heads, head_dim)
        assert torch.equal(alone, together[n : n + 1]), f"token at {int(positions[n])}"
        p = int(positions[n])
        qn = q[n].double().view(heads, head_dim)
        k = keys[1, :, : p + 1].double().repeat_interleave(heads // kv_heads, 0)  # [heads, p + 1, head_dim]
        v = values[1, :, : p + 1].double().repeat_interleave(heads // kv_heads, 0)
        weights = torch.softmax((k @ qn[:, :, None]).squeeze(-1) / head_dim ** 0.5, -1)  # [heads, p + 1]
        expected = (weights[:, None, :] @ v).reshape(-1)
        assert (together[n].double() - expected).abs().max() < 0.05


def test_speculative_greedy_output_equals_plain_in_bf16(model):
    """Through the verifier: drafts of the plain continuation, corrupted at some positions, verified
    in passes of up to 6 tokens, give exactly the tokens plain one-token steps give."""
    prompt, steps = [3, 14, 15, 92, 65, 35, 89, 79], 24
    static = STATIC if TEST_DEVICE.type == "cuda" else None

    def generate(plain: list[int] | None) -> tuple[list[int], int]:
        verifier = Verifier(model, static, kernels="triton")
        out, accepted = [verifier.admit("r", prompt, SamplingParams(max_tokens=steps))], 0
        while len(out) < steps:
            draft = None
            if plain is not None:  # every fifth token wrong
                done = len(out)
                draft = Draft(np.asarray([t if (done + i) % 5 else (t + 1) % TINY_VOCAB
                                          for i, t in enumerate(plain[done : done + 5])], dtype=np.int32))
            verdict = verifier.step(Batch.of(["r"], [out[-1]], [draft]))
            out.extend(verdict.emitted(0))
            accepted += int(verdict.accepted[0])
        return out[:steps], accepted

    plain, _ = generate(None)
    speculative, accepted = generate(plain)
    assert accepted >= steps // 2  # the drafts were mostly taken: passes of several tokens ran
    assert speculative == plain
