"""The `ngram` drafter by name (`create_drafter`): its options and the target's EOS taken, bad options
refused with a message that names them, and `end` idempotent and forgetting the request."""

from __future__ import annotations

import pytest

from specdraft.drafters import Drafter, create_drafter
from specdraft.drafters.ngram import NgramDrafter
from specdraft.params import SamplingParams


def test_registry_builds_the_indexed_drafter_with_its_options():
    drafter = create_drafter("ngram", k=7, max_n=5, copy_min_n=2, min_confidence=0.25, adaptive=False)
    assert isinstance(drafter, NgramDrafter) and isinstance(drafter, Drafter)
    assert (drafter.k, drafter.max_n, drafter.copy_min_n, drafter.min_confidence) == (7, 5, 2, 0.25)
    assert drafter.memory is None and not drafter.adaptive


def test_registry_takes_eos_from_the_target():
    class Target:
        eos_token_ids = (2, 0)

    assert create_drafter("ngram", target=Target()).eos.tolist() == [0, 2]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_n": 1}, "max_n must be >= 2, got 1"),
        ({"copy_min_n": 0}, "copy_min_n must be >= 1, got 0"),
        ({"min_confidence": 1.5}, r"min_confidence must be in \[0, 1\], got 1.5"),
    ],
)
def test_invalid_options(options, message):
    with pytest.raises(ValueError, match=message):
        NgramDrafter(**options)


def test_end_is_idempotent_and_forgets():
    drafter = NgramDrafter()
    drafter.begin("r", [1, 2, 1], SamplingParams())
    drafter.end("r")
    drafter.end("r")
    with pytest.raises(KeyError):
        drafter.propose(["r"], [3])
