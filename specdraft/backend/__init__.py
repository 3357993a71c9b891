"""The model backend, shared by the verifier (the target) and the model drafter (the draft model):
`RowModel`, a causal LM with one KV-cache row per request; `RowKVCache`, its storage; the own
Llama-family forward it runs where it can; and the linear layers models are loaded with."""

from specdraft.backend.rowmodel import PREFILL_CHUNK, RowModel, StaticShapes

__all__ = ["PREFILL_CHUNK", "RowModel", "StaticShapes"]
