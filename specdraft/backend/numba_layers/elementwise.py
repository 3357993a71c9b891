"""Element math of a layer on its calling thread, as numba kernels over float32 rows: an exponential
that vectorises (`exp`, the attention's and the gates'), SiLU's and GELU-tanh's gates, the RMS norm
(of a row, of each head) and the rotary embedding; and `SUM`, the one liberty every summing kernel
here takes."""

from __future__ import annotations

import numpy as np
from numba import njit

SUM = {"reassoc", "contract"}  # sums spread over vector lanes, multiply-adds fused; no other liberty

_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)


@njit(fastmath=SUM, cache=True)
def exp(x, out, scale):  # pragma: no cover - compiled
    """out = exp(x) for float32 rows x [n], as two loops that vectorise (a libm call per element does
    not, and a pass of a few tokens spends much of its time in the attention's and SiLU's
    exponentials):
    exp(x) = 2^m * p(r), m = round(x / ln 2), r = x - m ln 2 in [-ln2/2, ln2/2], p its Taylor
    polynomial to r^7 (float32 rounding). x is clamped to [-87, 88], where
    float32's exponential stays normal. scale: int32 scratch [n]."""
    for i in range(x.shape[0]):
        v = min(max(x[i], np.float32(-87.0)), np.float32(88.0))
        m = np.floor(v * _LOG2E + np.float32(0.5))
        r = v - m * _LN2_HI - m * _LN2_LO
        out[i] = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(0.5) + r * (
            np.float32(1.0 / 6) + r * (np.float32(1.0 / 24) + r * (np.float32(1.0 / 120) + r * (
                np.float32(1.0 / 720) + r * np.float32(1.0 / 5040)))))))
        scale[i] = (np.int32(m) + np.int32(127)) << np.int32(23)  # 2^m as float32 bits
    factor = scale.view(np.float32)
    for i in range(x.shape[0]):
        out[i] *= factor[i]


@njit(cache=True, error_model="numpy")
def silu_gate(gate_up, act):  # pragma: no cover - compiled
    """act[t, j] = silu(gate[t, j]) * up[t, j]; gate_up [N, 2 * inter]: gate, then up. (The divisor is
    at least 1: no check for zero, which would keep the division from vectorising.)"""
    inter = act.shape[1]
    negated, e, scale = np.empty(inter, np.float32), np.empty(inter, np.float32), np.empty(inter, np.int32)
    for t in range(act.shape[0]):
        gate, up, out = gate_up[t, :inter], gate_up[t, inter:], act[t]  # rows: loops that vectorise
        for j in range(inter):
            negated[j] = -gate[j]
        exp(negated, e, scale)
        for j in range(inter):
            out[j] = gate[j] / (np.float32(1.0) + e[j]) * up[j]


_GELU_BETA = np.float32(0.7978845608028654)  # sqrt(2 / pi)
_GELU_KAPPA = np.float32(0.044715)


@njit(cache=True, error_model="numpy")
def gelu_tanh_gate(gate_up, act):  # pragma: no cover - compiled
    """act[t, j] = gelu_tanh(gate[t, j]) * up[t, j] (torch's "tanh" GELU: 0.5 g (1 + tanh(sqrt(2 / pi)
    (g + 0.044715 g^3)))), tanh(u) as 1 - 2 / (1 + exp(2u)) by `exp`, which vectorises; gate_up [N,
    2 * inter]: gate, then up."""
    inter = act.shape[1]
    doubled, e, scale = np.empty(inter, np.float32), np.empty(inter, np.float32), np.empty(inter, np.int32)
    for t in range(act.shape[0]):
        gate, up, out = gate_up[t, :inter], gate_up[t, inter:], act[t]
        for j in range(inter):
            g = gate[j]
            doubled[j] = np.float32(2.0) * _GELU_BETA * (g + _GELU_KAPPA * g * g * g)
        exp(doubled, e, scale)
        for j in range(inter):
            tanh = np.float32(1.0) - np.float32(2.0) / (np.float32(1.0) + e[j])
            out[j] = np.float32(0.5) * gate[j] * (np.float32(1.0) + tanh) * up[j]


@njit(fastmath=SUM, cache=True)
def rms_norm(x, weight, eps, out):  # pragma: no cover - compiled
    """Transformers' `LlamaRMSNorm` in float32: out = weight * x / sqrt(mean(x^2) + eps), per row."""
    width = x.shape[1]
    for t in range(x.shape[0]):
        s = np.float32(0.0)
        for i in range(width):
            s += x[t, i] * x[t, i]
        scale = np.float32(1.0) / np.sqrt(s / np.float32(width) + np.float32(eps))
        for i in range(width):
            out[t, i] = weight[i] * (x[t, i] * scale)


@njit(fastmath=SUM, cache=True)
def head_norm(y, start, heads, head_dim, weight, eps):  # pragma: no cover - compiled
    """`rms_norm` of each head in place on y[:, start : start + heads * head_dim], weight [head_dim]
    (Qwen3's q/k norms: the same arithmetic per head as a row's)."""
    for t in range(y.shape[0]):
        for head in range(heads):
            o = start + head * head_dim
            s = np.float32(0.0)
            for i in range(head_dim):
                s += y[t, o + i] * y[t, o + i]
            scale = np.float32(1.0) / np.sqrt(s / np.float32(head_dim) + np.float32(eps))
            for i in range(head_dim):
                y[t, o + i] = weight[i] * (y[t, o + i] * scale)


@njit(cache=True)
def rotate(y, start, heads, head_dim, cos, sin):  # pragma: no cover - compiled
    """Rotary embedding in place on y[:, start : start + heads * head_dim] (transformers' `rotate_half`) over
    each head's first cos.shape[1] dimensions (all of it, or Phi-4-mini's partial rotary: the rest as they are)."""
    half = cos.shape[1] // 2
    for t in range(y.shape[0]):
        for head in range(heads):
            o = start + head * head_dim
            for d in range(half):
                a, c = y[t, o + d], y[t, o + d + half]
                y[t, o + d] = a * cos[t, d] - c * sin[t, d]
                y[t, o + d + half] = c * cos[t, d + half] + a * sin[t, d + half]
