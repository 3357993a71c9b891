"""Native weights: a GGUF model's weights as its own blocks (Q4_1, Q8_0), read in place on CPU.

The embedded model's file holds Q4_1 projections and a Q8_0 embedding that is also its output layer:
97 MB, against 538 MB as float32. Every block dequantises exactly in float32 (w = d * q + m with
float16 d, m and a 4- or 8-bit q: the product is exact, the sum rounds once, as the float32 copy
holds it), so reading the blocks and expanding them in the kernel gives the dense model's values
from a fifth of the bytes. `blocks.cpp` is that kernel, for float32 rows and blocks alike, summed in
one order for both (its header says which), so that native and dense weights give bitwise the same
logits.

This package is their one face; its modules, by job:
- `format`: the kinds, their sizes (as `blocks.cpp` states them: `Kernel.kind`), `dequantize` by torch.
- `cpp_kernel`: building and loading `blocks.cpp` with `attention.cpp` (the CPU step's attention)
  (`kernel()`, or `kernel_problem()`: why there is none) and calling it from numba (`call` with a
  `Projection` or an `Attention`; `project_native`, a projection).
- `readers`: which code reads a model's weights (`reader`: the kernel, numba's loops or torch).
- `modules`: `BlockLinear`, `BlockEmbedding`, torch modules over blocks; the arithmetic a
  `BlockLinear` computes in (`ARITHMETICS`, `use_arithmetic`).
- `gguf_file`: a GGUF's blocks swapped into a loaded model (`use_gguf_blocks`).
"""

from specdraft.backend.blocks.cpp_kernel import (MAX_JOB_QUERIES, MAX_SPAN, PATHS, Attention, Kernel, Projection, call,
                                                 job_queries, kernel, kernel_problem, project_native)
from specdraft.backend.blocks.format import BLOCK, BLOCK_BYTES, F32, NAMES, Q4_1, Q8_0, dequantize, unit
from specdraft.backend.blocks.gguf_file import rotary_order, use_gguf_blocks
from specdraft.backend.blocks.modules import (ARITHMETICS, BlockEmbedding, BlockLinear, dense_values, int8_problem,
                                              use_arithmetic)
from specdraft.backend.blocks.readers import Reader, Storage, reader

__all__ = ["ARITHMETICS", "Attention", "MAX_JOB_QUERIES", "MAX_SPAN", "BLOCK", "BLOCK_BYTES", "F32", "NAMES", "PATHS", "Q4_1", "Q8_0", "BlockEmbedding", "BlockLinear", "Kernel",
           "Projection", "Reader", "Storage", "call", "dense_values", "dequantize", "int8_problem", "job_queries", "kernel", "kernel_problem",
           "project_native", "reader", "rotary_order", "unit", "use_arithmetic", "use_gguf_blocks"]
