"""The native kernel wing: a GGUF model's weights as its own blocks (`formats.KINDS`: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, IQ4_NL, the K kinds Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS, and float16 and bfloat16 weights,
F16 and BF16), read in place on CPU by a
compiled C++ kernel that lives here too (`csrc/`).

The embedded model's file holds Q4_1 projections and a Q8_0 embedding that is also its output layer:
97 MB, against 538 MB as float32; the Qwen2.5-Coder files hold Q4_K, Q6_K, Q5_0 and Q8_0. Every block
dequantises exactly in float32 (w = d * q + m with float16 d, m and a 4- to 8-bit q, a K kind's d
times a sub-block's 6- or 8-bit scale first: the products are exact, a sum rounds once, as the
float32 copy holds it), so reading the blocks and expanding them in the kernel gives the dense
model's values from a fraction of the bytes. The kernel sums float32 rows and blocks in one order
(`csrc/float32.cpp` says which), so that native and dense weights give bitwise the same logits; its
int8 arithmetic (`csrc/int8.cpp`) meets the blocks with each token quantised (F16's and BF16's: rounded
to the kind, then summed as float32's), in one order on every build.

Its parts, by job:
- `formats`: the block kinds, one entry each (`KINDS`: size, float16 fields, dequantisation by torch).
- `build`: compiling `csrc/` for this machine (`build`, one of `PATHS`).
- `library`: the loaded kernel (`kernel()`, `Kernel`; or `kernel_problem()`: why there is none).
- `calls`: calling it from numba (`call` with a `Projection` or an `Attention`; `project_native`,
  `project_blocks`).
- `readers`: which code reads a model's weights (`reader`: the kernel, numba's loops or torch).
- `modules`: `BlockLinear`, `BlockEmbedding`, torch modules over blocks; the arithmetic a
  `BlockLinear` computes in (`ARITHMETICS`, `use_arithmetic`).
- `pages`: memory on 2 MB pages for the weights a step streams (`huge_page_buffer`).
- `gguf_file`: a GGUF read in place: its blocks swapped into a model (`use_gguf_blocks`), its other
  tensors read as transformers' loader gives them (`read_gguf`, `dense_tensor`).
- `layout`: where a GGUF's tensors lie in its file (`GgufLayout`, `TensorInfo`), the value
  `models.gguf_check` returns and hands down to `gguf_file`.
- `csrc/`: the kernel's C++: `formats.h` (the block formats, one traits entry a kind, `Traits<KIND>`,
  and `with_kind`, the one dispatch from a kind's number to the code compiled for it), `projection.h` (a
  projection's struct, shared by every file below), `entry.cpp` (the entry points), `quantize.cpp`
  (the int8 arithmetic's tokens), `float32.cpp` and `int8.cpp` (the two arithmetics;
  `int8_k.cpp` the K kinds' int8 tiles, `int8_k_pass.cpp` their passes of several tokens in 256-bit
  registers, `k_vectors.h` the vector operations both K files run on, `tiles.h` what the int8 files
  share), `attention.cpp` (the
  CPU step's attention), `for_count.h` (shared by them).
"""

from specdraft.backend.native.build import PATHS
from specdraft.backend.native.calls import (MAX_JOB_QUERIES, MAX_SPAN, Attention, Projection, call, job_queries,
                                            project_blocks, project_native)
from specdraft.backend.native.formats import (BF16, BLOCK, BLOCK_BYTES, F16, F32, FLOATS, IQ4_NL, IQ4_XS, KINDS, NAMES, Q2_K, Q3_K,
                                              Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, BlockKind, dequantize,
                                              kind_of, unit)
from specdraft.backend.native.gguf_file import rotary_order, use_gguf_blocks
from specdraft.backend.native.library import TILE_ROWS, Kernel, kernel, kernel_problem
from specdraft.backend.native.pages import huge_page_buffer
from specdraft.backend.native.modules import (ARITHMETICS, BlockEmbedding, BlockLinear, dense_values, int8_problem,
                                              use_arithmetic)
from specdraft.backend.native.readers import Reader, Storage, reader

__all__ = ["ARITHMETICS", "Attention", "BF16", "BLOCK", "BLOCK_BYTES", "BlockEmbedding", "BlockKind", "BlockLinear", "F16",
           "F32", "FLOATS",
           "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K",
           "KINDS", "Kernel", "MAX_JOB_QUERIES", "MAX_SPAN", "NAMES", "PATHS", "Projection", "Q4_0", "Q4_1", "Q4_K",
           "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Reader",
           "Storage", "TILE_ROWS", "call", "dense_values", "dequantize", "huge_page_buffer", "int8_problem", "job_queries", "kernel", "kind_of",
           "kernel_problem", "project_blocks", "project_native", "reader", "rotary_order", "unit", "use_arithmetic", "use_gguf_blocks"]
