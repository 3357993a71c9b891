"""Size is a tested property of the house: a Python function fits a screen (at most 60 lines) and a
Python file does one job (at most 500 lines), in the package and in the benchmarks, with a short list
of named exceptions, each with its reason. A function or file that grows past its limit is several."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("specdraft", "benchmarks")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500

# "path:function" or "path" -> why it may be longer. Keep this list short, and shrink it.
EXCEPTIONS: dict[str, str] = {}


def python_files() -> list[Path]:
    return sorted(path for room in ROOMS for path in (ROOT / room).rglob("*.py") if "results" not in path.parts)


def functions(tree: ast.AST):
    """(qualified name, lines) of every function and method of a module, nested ones included."""
    def walk(node: ast.AST, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    return walk(tree, "")


def oversized() -> list[str]:
    found = []
    for path in python_files():
        source = path.read_text()
        where = str(path.relative_to(ROOT))
        lines = len(source.splitlines())
        if lines > MAX_FILE_LINES and where not in EXCEPTIONS:
            found.append(f"{where}: {lines} lines (at most {MAX_FILE_LINES})")
        for name, length in functions(ast.parse(source, where)):
            if length > MAX_FUNCTION_LINES and f"{where}:{name}" not in EXCEPTIONS:
                found.append(f"{where}:{name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_every_function_and_file_fits_its_limit():
    assert oversized() == []


def test_every_exception_is_still_needed():
    """An exception whose function or file has shrunk (or gone) is struck off the list."""
    assert [name for name in EXCEPTIONS if not any(name in entry for entry in _unexcused())] == []


def _unexcused() -> list[str]:
    saved = dict(EXCEPTIONS)
    EXCEPTIONS.clear()
    try:
        return oversized()
    finally:
        EXCEPTIONS.update(saved)


@pytest.mark.parametrize("source, expected", [
    ("def f():\n" + "    x = 1\n" * 60, ["f: 61"]),
    ("def f():\n" + "    x = 1\n" * 59, []),
    ("class A:\n    def g(self):\n" + "        x = 1\n" * 70, ["A.g: 71"]),
])
def test_the_measure_counts_a_function_from_its_def_to_its_last_line(source, expected):
    measured = [f"{name}: {length}" for name, length in functions(ast.parse(source)) if length > MAX_FUNCTION_LINES]
    assert measured == expected
