"""Every benchmark writes into its subject's folder of `benchmarks/results/` by default: each path the
benchmarks build from `RESULTS` (a `cli` default `--out`, a default input such as `structured.json`)
starts with a folder the results hold, and none is `RESULTS` itself (its top holds no reports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks.common import RESULTS

BENCHMARKS = RESULTS.parent
SUBJECTS = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())


def results_paths(source: str) -> list[tuple[int, tuple[str, ...]]]:
    """(line, parts) of each use of `RESULTS` in a module's source: the names a `RESULTS / "a" / "b"`
    chain joins (up to the first that is not a string), () where `RESULTS` is used bare."""
    tree = ast.parse(source)
    seen, out = set(), []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)) or id(node) in seen:
            continue
        chain, left = [], node
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Div):
            seen.add(id(left))
            chain.append(left.right)
            left = left.left
        if isinstance(left, ast.Name) and left.id == "RESULTS":
            seen.add(id(left))
            parts = []
            for part in reversed(chain):
                if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                    break
                parts.append(part.value)
            out.append((node.lineno, tuple(parts)))
    out += [(node.lineno, ()) for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == "RESULTS" and id(node) not in seen]
    return sorted(out)


def misplaced(source: str) -> list[str]:
    """Each `RESULTS` path of a module that does not start in a subject folder, as `line: path`."""
    return [f"{line}: {'/'.join(('RESULTS', *parts))}" for line, parts in results_paths(source)
            if not parts or parts[0] not in SUBJECTS]


MODULES = sorted(p for p in BENCHMARKS.rglob("*.py") if "results" not in p.relative_to(BENCHMARKS).parts
                 and p.name != "common.py")


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_a_benchmark_writes_into_a_subject_folder(module: Path):
    assert misplaced(module.read_text()) == []


def test_every_benchmark_with_a_command_line_names_its_folder():
    """`cli` takes the folder (no default), and the benchmarks that call it are found here."""
    calls = [m for m in MODULES if "cli(__doc__, RESULTS / " in m.read_text()]
    assert len(calls) >= 25
    assert [m.name for m in MODULES if "cli(__doc__)" in m.read_text()] == []


def test_the_check_sees_the_top_and_an_unknown_folder():
    """Negative control: `RESULTS` bare, `RESULTS / "x.json"` and an unknown folder are misplaced; a
    subject folder, nested, is not."""
    source = ('a = RESULTS\nb = RESULTS / "x.json"\nc = RESULTS / "no_such_subject" / "y"\n'
              f'd = RESULTS / "{SUBJECTS[0]}" / "z"\n')
    assert misplaced(source) == ["1: RESULTS", "2: RESULTS/x.json", "3: RESULTS/no_such_subject/y"]
