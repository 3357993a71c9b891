"""A GGUF model's weights as its own blocks (Q4_1, Q8_0), read in place on CPU.

The embedded model's file holds Q4_1 projections and a Q8_0 embedding that is also its output layer:
97 MB, against 538 MB as float32. Every block dequantises exactly in float32 (w = d * q + m with
float16 d, m and a 4- or 8-bit q: the product is exact, the sum rounds once, as the float32 copy
holds it), so reading the blocks and expanding them in the kernel gives the dense model's values
from a fifth of the bytes. `blocks.cpp` is that kernel, for float32 rows and blocks alike, summed in
one order for both (its header says which), so that native and dense weights give bitwise the same
logits; it is compiled at first use by the machine's C++ compiler (the one torch's inductor needs)
for this machine's instructions and cached under the cache dir.

- `BlockLinear`, `BlockEmbedding`: modules over a tensor of blocks [out, row bytes]; called as
  modules (prefill chunks, other devices) they dequantise and compute as the dense modules do, so a
  long pass gives the dense pass's result too.
- `use_gguf_blocks(model, gguf)`: swap a loaded model's Q4_1/Q8_0 linears (and embedding) for them
  (`gguf_blocks` reads the file, `use_blocks` swaps).
- `kernel()`: the compiled kernel (its address for numba, `numba_layers`), or why there is none.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from specdraft.backend.linear import few_rows_linear
from specdraft.params import cache_dir

F32, Q4_1, Q8_0 = 0, 1, 2  # kinds, as blocks.cpp numbers them
BLOCK = 32  # weights per block
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}  # float16 d (and m) and the packed q
GGUF_KINDS = {"Q4_1": Q4_1, "Q8_0": Q8_0}
_SOURCE = Path(__file__).with_name("blocks.cpp")


def dequantize(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """blocks [rows, row bytes] uint8 -> float32 [rows, width], the values the dense copy holds."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, width // BLOCK, BLOCK_BYTES[kind])  # [rows, blocks, bytes]
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # [rows, blocks, 1]
    if kind == Q8_0:
        q = b[..., 2:].contiguous().view(torch.int8).float()  # [rows, blocks, 32]
        return (q * d).reshape(rows, width)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    packed = b[..., 4:]  # [rows, blocks, 16]: element j in the low nibble, j + 16 in the high one
    q = torch.cat([packed & 15, packed >> 4], dim=-1).float()  # [rows, blocks, 32]
    return (d * q + m).reshape(rows, width)


@intrinsic
def call(typingctx, address, kind, w, row_bytes, width, x, n, xs, y, ys, b, r, rs, start, end):  # pragma: no cover
    """Call the C function at `address` (`blocks.cpp`'s `specdraft_project`) with these 14 integers
    (pointers as integers): a call by address, so a cached kernel holds no process's addresses."""
    arguments = (kind, w, row_bytes, width, x, n, xs, y, ys, b, r, rs, start, end)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        values = [context.cast(builder, v, t, types.int64) for v, t in zip(args[1:], signature.args[1:])]
        function = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64),
                                    ir.FunctionType(ir.VoidType(), [i64] * len(values)).as_pointer())
        builder.call(function, values)
        return context.get_dummy_value()

    return types.void(address, *arguments), codegen


_ROWS = 16  # rows a work item of `expand` takes


@njit(parallel=True, cache=True)
def expand(w, kind, y, kernel):  # pragma: no cover - compiled
    """y [out, width] = the float32 values of w [out, row bytes] (blocks of `kind`), by the compiled
    kernel's `specdraft_expand` at address `kernel`, blocks of rows among the threads."""
    out = w.shape[0]
    for block in prange((out + _ROWS - 1) // _ROWS):
        start, end = block * _ROWS, min(out, block * _ROWS + _ROWS)
        call(kernel, kind, w.ctypes.data, w.shape[1], y.shape[1], 0, 0, 0, y.ctypes.data, y.shape[1], 0, 0, 0,
              start, end)


def dense_values(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """`dequantize`'s values: by the compiled kernel on CPU where there is one (a pass over the
    blocks on every thread), else by torch."""
    compiled = kernel_or_none() if blocks.device.type == "cpu" else None
    if compiled is None:
        return dequantize(blocks, kind, width)
    out = torch.empty(blocks.shape[0], width)
    expand(blocks.contiguous().numpy(), kind, out.numpy(), compiled.expand_address)
    return out


class BlockLinear(torch.nn.Module):
    """A linear layer (no bias) whose weight is GGUF blocks [out, row bytes] (a buffer, `blocks`).
    As a module it dequantises and runs `FewRowsLinear`'s arithmetic, the dense layer's result."""

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int) -> None:
        super().__init__()
        assert blocks.dtype == torch.uint8 and blocks.shape[1] == in_features // BLOCK * BLOCK_BYTES[kind]
        self.in_features, self.out_features, self.kind = in_features, blocks.shape[0], kind
        self.register_buffer("blocks", blocks)
        self.bias = None

    def dense(self) -> torch.Tensor:
        """The float32 weight [out, in] these blocks hold."""
        return dense_values(self.blocks, self.kind, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return few_rows_linear(x, self.dense().to(x.dtype), None)  # as `FewRowsLinear`, call for call

    def extra_repr(self) -> str:
        kind = {Q4_1: "Q4_1", Q8_0: "Q8_0"}[self.kind]
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind} blocks"


class BlockEmbedding(torch.nn.Module):
    """A token embedding read from GGUF blocks (shared with a tied `BlockLinear` output layer)."""

    def __init__(self, blocks: torch.Tensor, kind: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.kind = blocks.shape[0], embedding_dim, kind
        self.register_buffer("blocks", blocks)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = dense_values(self.blocks[ids.reshape(-1)], self.kind, self.embedding_dim)
        return rows.reshape(*ids.shape, self.embedding_dim)


# -- loading a GGUF's blocks into a model ------------------------------------------------------------

_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def _rotary_order(rows: int, heads: int) -> np.ndarray:
    """The row order transformers gives a GGUF's q (k) weight: llama.cpp stores each head's rotary
    halves interleaved; transformers' `_reverse_permute_weights` undoes that, row by row."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(2, 1).reshape(-1)


def gguf_blocks(gguf: Path, config) -> dict[str, tuple[np.ndarray, int]]:
    """Every Q4_1/Q8_0 tensor of a Llama GGUF by its transformers name: (blocks [rows, row bytes]
    uint8 in transformers' row order, kind). Other types are left out (they stay dense)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    out = {}
    for tensor in reader.tensors:
        kind = GGUF_KINDS.get(tensor.tensor_type.name)
        if kind is None:
            continue
        blocks = np.asarray(tensor.data)  # [rows, row bytes], memory-mapped
        name = tensor.name
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = (blocks, kind)
        elif name == "output.weight":
            out["lm_head.weight"] = (blocks, kind)
        elif name.startswith("blk."):
            _, layer, part, _ = name.split(".")
            module = next((k for k, v in _NAMES.items() if v == part), None)
            if module is None:
                continue
            if part in ("attn_q", "attn_k"):
                blocks = blocks[_rotary_order(blocks.shape[0], heads if part == "attn_q" else kv_heads)]
            group = "self_attn" if part.startswith("attn") else "mlp"
            out[f"model.layers.{layer}.{group}.{module}.weight"] = (blocks, kind)
    return out


def use_gguf_blocks(model: torch.nn.Module, gguf: Path) -> int:
    """Swap `model`'s linear layers (and its embedding, and a tied output layer) whose GGUF tensors
    are Q4_1 or Q8_0 for modules over the file's blocks (`use_blocks`)."""
    return use_blocks(model, gguf_blocks(gguf, model.config))


def use_blocks(model: torch.nn.Module, found: dict[str, tuple[np.ndarray, int]]) -> int:
    """Swap the modules named in `found` (a weight's name -> (blocks [rows, row bytes], kind), as
    `gguf_blocks` gives) for `BlockLinear`s (`BlockEmbedding`), over copies of the blocks; a tied
    output layer follows the embedding. The dense weights they replace are dropped. Returns how
    many modules were swapped."""
    swapped = 0
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding.weight
    if "model.embed_tokens.weight" in found:
        blocks, kind = found["model.embed_tokens.weight"]
        assert blocks.shape[0] == embedding.num_embeddings
        model.model.embed_tokens = BlockEmbedding(torch.from_numpy(blocks.copy()), kind, embedding.embedding_dim)
        swapped += 1
        if tied and "lm_head.weight" not in found:
            model.lm_head = BlockLinear(model.model.embed_tokens.blocks, kind, embedding.embedding_dim)
            swapped += 1
    for name, (blocks, kind) in found.items():
        if name == "model.embed_tokens.weight":
            continue
        parent_name, _, child = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        assert old.bias is None and blocks.shape[0] == old.out_features, name
        setattr(parent, child, BlockLinear(torch.from_numpy(blocks.copy()), kind, old.in_features))
        swapped += 1
    return swapped


def block_modules(model: torch.nn.Module) -> bool:
    """Whether any of `model`'s layers read GGUF blocks."""
    return any(isinstance(m, (BlockLinear, BlockEmbedding)) for m in model.modules())


# -- the compiled kernel -------------------------------------------------------------------------


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _machine() -> str:
    """What `-march=native` compiles for here: the CPU's model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "\n".join(lines)


def build(portable: bool = False) -> Path:
    """Compile blocks.cpp for this machine (`portable`: without the AVX2 intrinsics, the loops every
    machine runs), once per source, compiler and CPU; return the shared library's path."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"]
    if portable:
        flags.append("-DSPECDRAFT_PORTABLE")
    key = hashlib.sha256("\0".join([_SOURCE.read_text(), version, _machine(), *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"blocks-{key}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([compiler, *flags, str(_SOURCE), "-o", str(built)], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling {_SOURCE.name} failed: {result.stderr.strip()[-2000:]}")
            os.replace(built, target)  # atomic: a concurrent build of the same key writes the same file
    return target


class Kernel:
    """The loaded kernel: `address` of `specdraft_project` (what numba calls), `avx2` whether it
    runs the AVX2 intrinsics (else the portable loops)."""

    def __init__(self, path: Path) -> None:
        self._library = ctypes.CDLL(str(path))  # kept: unloading it would free the code
        self.address = ctypes.cast(self._library.specdraft_project, ctypes.c_void_p).value
        self.expand_address = ctypes.cast(self._library.specdraft_expand, ctypes.c_void_p).value
        version = ctypes.CFUNCTYPE(ctypes.c_int64)(ctypes.cast(self._library.specdraft_blocks_version, ctypes.c_void_p).value)
        self.avx2 = version() == 2


@functools.cache
def kernel(portable: bool = False) -> Kernel:
    """The compiled kernel for this machine (compiled at first use; raises RuntimeError saying why
    it cannot be)."""
    if platform.system() != "Linux" and platform.system() != "Darwin":
        raise RuntimeError(f"the block kernel is built for Linux and macOS, not {platform.system()}")
    return Kernel(build(portable))


def kernel_or_none() -> Kernel | None:
    try:
        return kernel()
    except (RuntimeError, OSError):
        return None
