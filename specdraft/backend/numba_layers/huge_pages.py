"""Weights moved once onto 2 MB pages in the order a step reads them (`on_huge_pages`): streaming
them from 4 KB pages costs a page walk every 4 KB, which 2 MB pages spare."""

from __future__ import annotations

import torch

from specdraft.backend.native import BlockLinear, huge_page_buffer


def _read_name(module: torch.nn.Module) -> str:
    """The attribute holding what a step reads of a linear: its GGUF blocks or its weight."""
    return "blocks" if isinstance(module, BlockLinear) else "weight"


def _joinable(groups: list[list[torch.nn.Module]]) -> list[list[torch.nn.Module]]:
    """The groups whose tensors can lie as one [rows, width] array (one dtype, one row width); a group
    that mixes them (GGUF blocks of two kinds, or blocks beside float32 rows: a step reads it as a
    float32 copy, `grouping`) as groups of one linear each."""
    out = []
    for g in groups:
        kinds = {(getattr(m, _read_name(m)).dtype, getattr(m, _read_name(m)).shape[1]) for m in g}
        out.extend([g] if len(kinds) == 1 else [[m] for m in g])
    return out


def on_huge_pages(model: torch.nn.Module, groups: list[list[torch.nn.Module]]) -> None:
    """Move these linears' weights (or blocks) into one `huge_page_buffer`, each group's adjacent
    (its joined projection is then a view; a group of mixed kinds, each linear on its own:
    `_joinable`) and the groups in the order given (the order a step reads them). Each module's
    tensor becomes a view of the buffer holding the same values (a tied input embedding follows the
    output layer), so the loader's memory is freed, not kept twice. Tensors moved already (another
    step built over the same layers, or tiled onto them: `use_arithmetic`) stay where they are."""
    groups = [g for g in _joinable(groups) if not all(getattr(getattr(m, _read_name(m)), "_on_huge_pages", False) for m in g)]
    if not groups:
        return
    tensors = [[getattr(m, _read_name(m)) for m in g] for g in groups]
    nbytes = [sum(t.numel() * t.element_size() for t in g) for g in tensors]
    sizes = [-(-n // 4096) * 4096 for n in nbytes]  # 4 KB aligned each
    buffer, offset = huge_page_buffer(sum(sizes)), 0
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        for group, olds, n, size in zip(groups, tensors, nbytes, sizes):
            first = olds[0]
            joined = torch.from_numpy(buffer[offset : offset + n]).view(first.dtype).view(-1, first.shape[1])
            start = 0
            for m, old in zip(group, olds):
                view = joined[start : start + old.shape[0]]
                if isinstance(old, torch.nn.Parameter):  # a parameter stays one, a buffer (int8 weights) a buffer
                    view = torch.nn.Parameter(view, requires_grad=old.requires_grad)
                view.copy_(old)
                view._on_huge_pages = True
                setattr(m, _read_name(m), view)
                if embedding is not None and getattr(embedding, _read_name(m), None) is old:
                    setattr(embedding, _read_name(m), view)
                start += old.shape[0]
            offset += size
