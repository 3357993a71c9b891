"""A layer's attention over a pass (`attend`): each token's new key and value written into its row's
cache first, then attention over the row's entries in spans at fixed offsets (flash-decoding's split,
fixed so that a token's result does not depend on the pass it is in), each span by the compiled
kernel (`csrc/attention.cpp`) where it compiles and takes the shape, else by numba's loops, and the
spans joined after, in order. The cache is paged (`backend.paged`): a span is one page, found through
the pass's table; a span that none of a job's tokens sees is not read at all."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from specdraft.backend import native
from specdraft.backend.cache import SPAN
from specdraft.backend.numba_layers.elementwise import SUM, exp


def attention_kernel(heads: int, kv_heads: int, head_dim: int) -> int:
    """`attend`'s kernel: the compiled kernel's `specdraft_attend` where it compiles and takes this
    shape (head_dim a multiple of 16), else 0: numba's loops."""
    fits = head_dim % 16 == 0 and SPAN <= native.MAX_SPAN
    return native.kernel().attend_address if fits and native.kernel_problem() is None else 0


@njit(cache=True)
def _write_entries(qkv, rows, positions, keys, values, table, heads, kv_heads, head_dim):  # pragma: no cover
    """Each token's k and v (of qkv [N, (heads + 2 kv_heads) * head_dim]) into its row's page at its
    position: all of them before any attention, so that a row's tokens in this pass see each other."""
    for t in range(qkv.shape[0]):
        page, at = table[rows[t], positions[t] // SPAN], positions[t] % SPAN
        for g in range(kv_heads):
            key, value = keys[page, g, at], values[page, g, at]  # [head_dim] views
            k, v = (heads + g) * head_dim, (heads + kv_heads + g) * head_dim
            for d in range(head_dim):
                key[d] = qkv[t, k + d]
                value[d] = qkv[t, v + d]


@njit(cache=True)
def _attention_share(part, parts, kv_heads, spans, chunks, size, queries, kv, width):  # pragma: no cover - compiled
    """The kernel's attention jobs [start, end) that thread share `part` of `parts` computes: the jobs
    in their order (kv head, span, chunk of `size` of its `queries`), each weighing its queries times
    its span's entries (the last span of `kv` entries is partly filled), in shares of about equal
    weight (a job goes to the share its middle falls in). Equal numbers of jobs were not equal work:
    with two spans, the one full and the other nearly empty, one thread took twice the other's."""
    total = kv_heads * kv * queries
    done = start = end = 0
    for _ in range(kv_heads):
        for span in range(spans):
            entries = min(width, kv - span * width)
            for chunk in range(chunks):
                weight = entries * min(size, queries - chunk * size)
                share = (2 * done + weight) * parts // (2 * total)
                start += share < part
                end += share <= part
                done += weight
    return start, end


@njit(parallel=True, fastmath=SUM, cache=True)
def _spans_by_kernel(qkv, rows, visible, keys, values, table, heads, kv_heads, head_dim, tops, totals, sums, kernel,
                     threads):  # pragma: no cover - compiled
    """Every span's softmax parts (tops, totals, sums) by the compiled kernel at address `kernel`: a job
    per span and chunk of a kv head's (token, query head) pairs (at most `native.MAX_JOB_QUERIES`,
    `native.job_queries`), the jobs shared among `threads` by their work (`_attention_share`)."""
    n, kv, width, spans = qkv.shape[0], visible.shape[1], SPAN, tops.shape[2]
    group = heads // kv_heads
    size = native.job_queries(n * group)
    chunks = (n * group + size - 1) // size
    parts = max(1, min(threads, kv_heads * spans * chunks))
    for part in prange(parts):  # the Attention made here: a parallel loop takes none in
        start, end = _attention_share(part, parts, kv_heads, spans, chunks, size, n * group, kv, width)
        attention = native.Attention(
            qkv=qkv.ctypes.data, qkv_stride=qkv.shape[1], rows=rows.ctypes.data, visible=visible.ctypes.data,
            kv=kv, keys=keys.ctypes.data, values=values.ctypes.data, table=table.ctypes.data,
            table_stride=table.shape[1], heads=heads,
            kv_heads=kv_heads, head_dim=head_dim, span=width, spans=spans, tokens=n, tops=tops.ctypes.data,
            totals=totals.ctypes.data, sums=sums.ctypes.data)
        native.call(kernel, attention, start, end)


@njit(parallel=True, fastmath=SUM, cache=True)
def _spans_by_loops(qkv, rows, visible, keys, values, table, heads, kv_heads, head_dim, tops, totals, sums):  # pragma: no cover
    """Every span's softmax parts (tops, totals, sums) by numba's loops: a job per (token, kv head, span),
    its query heads together."""
    n, kv, width, spans = qkv.shape[0], visible.shape[1], SPAN, tops.shape[2]
    group = heads // kv_heads
    scale = np.float32(1.0 / np.sqrt(head_dim))
    for job in prange(n * kv_heads * spans):  # tokens fastest: a thread's jobs reuse one span of the cache
        t, span, g = job % n, (job // n) % spans, job // (n * spans)
        first = span * width
        seen = np.zeros(width, np.bool_)
        anything = False
        for j in range(min(width, kv - first)):
            seen[j] = visible[t, first + j]
            anything |= seen[j]
        if not anything:  # what the loops below give a span with nothing seen, without reading it
            for u in range(group):
                h = g * group + u
                tops[t, h, span], totals[t, h, span] = -np.inf, np.float32(0.0)
                for d in range(head_dim):
                    sums[t, h, span, d] = np.float32(0.0)
            continue
        scores = np.full((group, width), -np.inf, np.float32)
        top = np.full(group, -np.inf, np.float32)
        page = table[rows[t], span]
        k, v = keys[page, g], values[page, g]  # [span, head_dim]
        for j in range(width):
            if seen[j]:
                kj = k[j]
                for u in range(group):
                    # Slices, so that the inner loops index from 0 and vectorise.
                    query = qkv[t, (g * group + u) * head_dim : (g * group + u + 1) * head_dim]
                    acc = np.float32(0.0)
                    for d in range(head_dim):
                        acc += query[d] * kj[d]
                    scores[u, j] = acc * scale
                    top[u] = max(top[u], scores[u, j])
        weights, scratch = np.empty((group, width), np.float32), np.empty(width, np.int32)
        for u in range(group):
            if top[u] > -np.inf:  # a span with nothing seen adds nothing
                for j in range(width):
                    scores[u, j] -= top[u]  # unseen entries (-inf) get weights that are never read
                exp(scores[u], weights[u], scratch)
        total = np.zeros(group, np.float32)
        attended = np.zeros((group, head_dim), np.float32)
        for j in range(width):
            if seen[j]:
                vj = v[j]
                for u in range(group):
                    e = weights[u, j]
                    total[u] += e
                    row = attended[u]
                    for d in range(head_dim):
                        row[d] += e * vj[d]
        for u in range(group):
            h = g * group + u
            tops[t, h, span], totals[t, h, span] = top[u], total[u]
            for d in range(head_dim):
                sums[t, h, span, d] = attended[u, d]


@njit(fastmath=SUM, cache=True)
def _join(tops, totals, sums, out):  # pragma: no cover - compiled
    """Each token's and head's attention from its spans' softmax parts: tops, totals [N, heads, spans]
    (max score, sum of exp(score - max)), sums [N, heads, spans, head_dim] (values weighted so)."""
    n, heads, spans, head_dim = sums.shape
    for t in range(n):
        for h in range(heads):
            top = tops[t, h, 0]
            for span in range(1, spans):
                top = max(top, tops[t, h, span])
            o = out[t, h * head_dim : (h + 1) * head_dim]
            total = np.float32(0.0)
            for d in range(head_dim):
                o[d] = np.float32(0.0)
            for span in range(spans):
                if tops[t, h, span] > -np.inf:  # a span with nothing seen adds nothing
                    f = np.exp(tops[t, h, span] - top)  # 1 for the span that holds the maximum
                    total += f * totals[t, h, span]
                    for d in range(head_dim):
                        o[d] += f * sums[t, h, span, d]
            for d in range(head_dim):
                o[d] /= total



@njit(cache=True)
def attend(qkv, rows, positions, visible, keys, values, table, heads, kv_heads, head_dim, out, kernel,
           threads):  # pragma: no cover - compiled
    """Write each token's k and v into its row's cache at its position, then attention: out [N, heads *
    head_dim]. qkv [N, (heads + 2 kv_heads) * head_dim] (q, k rotated); rows, positions [N]: each
    token's row in the window and position; visible [N, kv] bool (which cache entries each token
    sees); keys, values [pages, kv_heads, SPAN, head_dim]: this layer's pools; table [batch, spans]:
    each of the window's rows' page for each span of `kv` entries (`PagedKVCache.table`).
    kernel: the compiled kernel's `specdraft_attend` address (`attention_kernel`), or 0: numba's loops;
    threads: the threads the kernel's jobs are shared among (numba's own thread count, read in here,
    would keep numba from caching this function).

    A job is queries that share a kv head (and its key and value loads) over a span of `SPAN` cache
    entries at a fixed offset, each span's softmax kept as (max, sum, weighted values) and joined
    after in order (`_join`). Either way one order of arithmetic per (token, head, span): the
    kernel's (csrc/attention.cpp states it), or numba's loops'."""
    n, kv = qkv.shape[0], visible.shape[1]
    _write_entries(qkv, rows, positions, keys, values, table, heads, kv_heads, head_dim)
    # Spans at fixed offsets (0, SPAN, 2 SPAN, ...), each computed over its whole width: a token's
    # keys are split, and every span's sums run, the same way whatever pass the token is in.
    spans = (kv + SPAN - 1) // SPAN
    assert spans <= table.shape[1] and keys.shape[2] == SPAN, "a page a span, each row's in the table"
    # Every job fills its own (token, head, span) entries; no array expressions here (in a parallel
    # function numba would run each as a parallel loop of its own).
    tops = np.empty((n, heads, spans), np.float32)
    totals = np.empty((n, heads, spans), np.float32)
    sums = np.empty((n, heads, spans, head_dim), np.float32)
    if kernel != 0:
        _spans_by_kernel(qkv, rows, visible, keys, values, table, heads, kv_heads, head_dim, tops, totals, sums,
                         kernel, threads)
    else:
        _spans_by_loops(qkv, rows, visible, keys, values, table, heads, kv_heads, head_dim, tops, totals, sums)
    _join(tops, totals, sums, out)
