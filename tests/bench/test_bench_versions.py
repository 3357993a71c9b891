"""`benchmarks.domains.versions.compare`: two versions' recorded outputs and times, from hand-made rows."""

from __future__ import annotations

import pytest

from benchmarks.domains.versions import DOMAINS, DRAFTERS, compare, report


def runs(seconds: float, changed: str | None = None) -> dict:
    rows = {}
    for domain in DOMAINS:
        for name in DRAFTERS:
            ids = [9, 9] if f"{domain}/p/{name}" == changed else [1, 2, 3, 4]
            rows[f"{domain}/p/{name}"] = {"ids": ids, "seconds": seconds * (2 if name == "none" else 1)}
    return rows


def test_the_same_outputs_and_the_speed_ratio():
    result = compare([runs(1.0), runs(1.0)], [runs(0.5), runs(0.5)])
    assert (result["outputs"], result["equal_in_every_run"], result["equal_to_none"]) == (9, 9, 9)
    cell = result["cells"]["code/ngram"]
    assert (cell["before_tok_s"], cell["after_tok_s"], cell["time_after_over_before"]) == (4.0, 8.0, 0.5)
    assert "| code | none | 2.0 | 4.0 | 0.50 |" in report(result)


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_output_that_changed_in_any_run_is_counted(where):
    before, after = [runs(1.0), runs(1.0)], [runs(1.0), runs(1.0)]
    (before if where == "before" else after)[1] = runs(1.0, changed="json/p/hybrid")
    result = compare(before, after)
    assert result["equal_in_every_run"] == 8


def test_a_pairs_model_drafter_gets_its_cells():
    def with_model(seconds: float) -> dict:
        rows = runs(seconds)
        rows.update({f"{domain}/p/model": {"ids": [1, 2, 3, 4], "seconds": seconds} for domain in DOMAINS})
        return rows

    result = compare([with_model(1.0)], [with_model(2.0)])
    assert result["outputs"] == 12 and result["equal_in_every_run"] == 12
    assert result["cells"]["json/model"]["time_after_over_before"] == 2.0
