"""The long-beside-short serving benchmark: medians over rounds, replies counted equal only in the same
round and place, and the report naming each checkout's figures."""

from __future__ import annotations

from benchmarks.serving import long_beside as bench


def run(peak_mb: int, texts: list[str]) -> dict:
    mb = 1 << 20
    return {"peak_over_before": peak_mb * mb, "after_over_before": -mb, "long_seconds": 30.0,
            "short_median_seconds": 10.0, "short_worst_seconds": 12.0, "short_tokens_per_second": 60.0,
            "wall_seconds": 31.0, "texts": texts}


def test_replies_count_equal_only_in_the_same_round_and_place():
    first = [run(100, ["a", "b"]), run(100, ["c", "d"])]
    assert bench.equal_replies(first, first) == "4/4"
    assert bench.equal_replies([run(100, ["b", "a"]), run(100, ["c", "x"])], first) == "1/4"


def test_the_report_gives_each_checkouts_medians():
    before = [run(7000, ["a"]), run(7700, ["a"]), run(9000, ["a"])]
    after = [run(600, ["a"]), run(500, ["b"]), run(700, ["a"])]
    sides = {name: {"median": bench.summary(rs), "runs": rs, "equal_replies": bench.equal_replies(rs, before)}
             for name, rs in (("before (abc)", before), ("this checkout", after))}
    assert sides["before (abc)"]["median"]["peak_over_before"] == 7700 * (1 << 20)
    text = bench.markdown({"date": "2026-12-07", "machine": "a CPU", "load_before": 0.1, "command": "--rounds 3",
                           "model": "embedded", "long": 8000, "short": 15, "max_tokens": 64, "rounds": 3, "checkouts": sides})
    assert "| before (abc) | **7700 MB** |" in text
    assert "| this checkout | **600 MB** |" in text and "| 2/3 |" in text
