"""A tiny draft/target pair for the model drafter's tests (`make_pair`, the `pair` fixture of
`tests/drafters/conftest.py`), its draft length and prompts."""

from __future__ import annotations

from tests.helpers.tiny import make_tiny_model, shallow_copy_of

K = 4
PROMPTS = [[5, 17, 42, 9, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [60], [33, 34, 35, 33, 34, 35, 33, 34],
           [70, 71, 72, 73, 70, 71, 72, 73, 70, 71], [8, 6, 7, 5, 3, 0, 9]]


def make_pair():
    """A 4-layer target and a draft made of its layers 0 and 3: related, not equal."""
    target = make_tiny_model(seed=11, layers=4, sharpen=12.0)
    return target, shallow_copy_of(target, keep=[0, 3])
