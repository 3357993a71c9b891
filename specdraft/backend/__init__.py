"""The model backend, shared by the verifier (the target) and the model drafter (the draft model).
Start at `rowmodel.py` (`RowModel`: a causal LM with one KV-cache row per request, and its static
shapes for CUDA graphs); `cache.py` holds its storage (`RowKVCache`: one block a layer), `paged.py`
its paged one (`PagedKVCache`: pages a row, what the CPU step reads); `forward.py` our own forward it
runs where it can (for the families `family.py` describes as data: Llama, Qwen2, Qwen3), which runs a
pass's layers one of the ways in `layers.py` (eager modules, `numba_layers/`'s kernels,
`inductor.py`'s compiled parts), reading their weights as `weights.py` gives them; `linear.py` the linear layers models are loaded with; `prefix.py` the prefix
cache, earlier requests' committed entries kept for prompts that start alike. `native/` is the kernel
wing: GGUF blocks read in place and the compiled C++ kernel that reads them; `weight_only_int8.py`
the int8 draft copies' layer."""

from specdraft.backend.rowmodel import PREFILL_CHUNK, RowModel, StaticShapes
from specdraft.backend.weights import worth_compiling

__all__ = ["PREFILL_CHUNK", "RowModel", "StaticShapes", "worth_compiling"]
