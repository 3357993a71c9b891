"""`NumbaLayers`: a Llama layer's per-token work on CPU as numba kernels, for float32, GGUF-block
(native) or int8 weights. One of the ways to run a pass's layers (`specdraft.backend.layers`), the one
the CPU step runs.

Projections (`projection`): float32 rows and GGUF blocks are read by the compiled kernel (`native`,
called by address from `native.project_native`'s parallel loop), which sums both one way, so native
and dense weights give bitwise the same logits (the float32 arithmetic; in the int8 one, the GGUF
blocks meet each token's quantised activations in integer dot products, and every pass runs here,
prefill chunks too: `NumbaLayers.takes`); int8 draft copies (`WeightOnlyInt8Linear`), and float32
weights where no kernel compiles, by numba's own loops. Which reads a model's weights: `native.reader`.

A CPU decode step is bound by reading the weights, so what matters is how fast a projection of a
few tokens streams its weight rows. Inductor's reduction (`inductor.InductorLayers`) sums each row
in one vector accumulator, a chain of dependent adds, and puts a barrier between its many loops,
well below the memory's rate. Here each projection is one parallel loop over blocks of weight rows
(`project`): two rows at a time, a token at a time (each token's sums the one loop's, whatever its
neighbours), the sums spread over vector lanes (numba's `reassoc`), the rows further on prefetched when a pass has several tokens or
int8 weights. The weights are moved once onto 2 MB pages in the order a step reads them
(`huge_pages`, in the groups `grouping` makes: no page walk every 4 KB). A layer is five parallel
loops: q/k/v; attention (`attention`: the new keys and values written first; one token's cache
entries split into spans at fixed offsets among the threads and joined after: each span by the
compiled kernel, `csrc/attention.cpp`, where it compiles, else by numba's loops); the output
projection with its residual; gate and up; down with its residual. Norms, the rotary embedding and
SiLU (`elementwise`) run between them on the calling thread, and the whole layer stack is one call
from Python (`stack`). Between the loops the worker thread spins briefly (`specdraft.threads`): a
sleeping one is slow to wake, and a step has a hundred or more loops. Where the time goes:
`benchmarks/results/cpu/cpu_profile.md`.

Same arithmetic as the eager layer, summed in another order: logits agree to float rounding
(`tests/backend/test_numba_layers.py`), greedy output equals Hugging Face `generate`'s on every test and
benchmark prompt. Float32 activations only: float32 weights (the target on CPU), GGUF blocks
(`native.BlockLinear`), or int8 ones with per-row scales (`WeightOnlyInt8Linear`, the int8 draft
copy: each weight converted as it is read, a quarter of the bytes); other dtypes keep inductor's
parts. Kernels are compiled once per machine (numba's disk cache) and loaded when the layers are
built, so no step pays for compiling.

Its modules, by job: `projection`, `elementwise`, `attention`, `huge_pages`, `grouping` (a model's
linears as a step reads them), `stack` (the layer class and the layer stack's kernels).
"""

from specdraft.backend.numba_layers.attention import attend, attention_kernel
from specdraft.backend.numba_layers.grouping import native_kernel, read_parts, step_weights
from specdraft.backend.numba_layers.projection import NO_KERNEL, NO_RESIDUAL, project
from specdraft.backend.numba_layers.stack import MAX_TOKENS, NumbaLayers

__all__ = ["MAX_TOKENS", "NO_KERNEL", "NO_RESIDUAL", "NumbaLayers", "attend", "attention_kernel",
           "native_kernel", "project", "read_parts", "step_weights"]
