"""The drafters' tests' fixtures."""

from __future__ import annotations

import pytest

from tests.helpers.pairs import make_pair


@pytest.fixture(scope="module")
def pair():
    """`tests.helpers.pairs.make_pair`: a 4-layer target and a draft made of two of its layers."""
    return make_pair()
