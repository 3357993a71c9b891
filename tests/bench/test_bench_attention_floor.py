"""The attention-floor benchmark's arithmetic: the attention work counted per (token, entry seen), and the
8000/512 bound from a measured short prefill."""

from __future__ import annotations

import pytest

from benchmarks.cpu import attention_floor as bench


def test_attention_work_counts_every_entry_each_token_sees():
    # positions 0, 1, 2 see 1, 2, 3 entries: 6, each 4 x heads x head_dim, in each layer
    assert bench.attention_flops(heads=2, head_dim=8, layers=3, first=0, stop=3) == 4 * 2 * 8 * 3 * 6
    assert bench.attention_flops(2, 8, 1, 0, 5) == bench.attention_flops(2, 8, 1, 0, 3) + bench.attention_flops(2, 8, 1, 3, 5)


def test_the_bound_is_the_rate_ratio_with_attention_at_a_given_rate():
    # A 512-token prefill of 0.5 s with 10 GFLOP of attention at 100 GFLOP/s: 0.4 s of everything else.
    b = bench.bound(short_seconds=0.5, attention_short=10e9, attention_long=2000e9, ours=100.0, peak=400.0)
    rest = 0.4 / 512
    assert b["rest_ms_per_token"] == pytest.approx(rest * 1e3)
    long_rate = 8000 / (8000 * rest + 2000e9 / 400e9)
    short_rate = 512 / (512 * rest + 10e9 / 400e9)
    assert b["at_blas_rate"] == pytest.approx(long_rate / short_rate)
    assert b["at_our_rate"] < b["at_blas_rate"] < 1
    assert bench.bound(0.5, 0.0, 0.0, 100.0, 400.0)["at_blas_rate"] == pytest.approx(1)
