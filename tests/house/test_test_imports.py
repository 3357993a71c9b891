"""No module under `tests/` imports a test module (`tests.test_*`, `tests.<room>.test_*`) or a conftest,
at its top or inside a function: what tests share lives in `tests/helpers/` (helpers, imported) or a
conftest.py (fixtures, which pytest hands out), so a test module can be moved, split or deselected
without breaking another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def imported_modules(tree: ast.AST, package: str = "tests") -> list[tuple[int, str]]:
    """(line, module) of every import in a file, anywhere in it: `from pkg import name` gives `pkg`, or
    `pkg.name` for each name where `pkg` is a package (name may be a module); a relative import is
    resolved against `package`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if is_test_module(module):
                out.append((node.lineno, module))
            else:
                out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return sorted(out)


def is_test_module(name: str) -> bool:
    """A test module or a conftest (or a name inside one)."""
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") or part == "conftest" for part in parts[1:])


def offenders() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(), str(where))
        for line, name in imported_modules(tree, ".".join(where.parent.parts)):
            if is_test_module(name):
                found.append(f"{where}:{line}: imports {name}")
    return found


def test_no_module_under_tests_imports_a_test_module():
    assert offenders() == []


@pytest.mark.parametrize("source, package, expected", [
    ("from tests.api.test_cli import run_cli\n", "tests.runtime", True),
    ("import tests.engine.test_engine\n", "tests.backend", True),
    ("from tests.backend import test_blocks\n", "tests.models", True),
    ("from tests.test_top import x\n", "tests", True),
    ("def f():\n    from tests.backend.test_qwen2 import make_tiny_qwen2\n", "tests.models", True),
    ("from .test_blocks import write_gguf\n", "tests.backend", True),
    ("from tests.conftest import make_tiny_model\n", "tests.engine", True),
    ("from tests.helpers.cli import run_cli\nfrom tests.helpers.tiny import loaded\n", "tests.runtime", False),
    ("from specdraft.drafters import create_drafter\nimport pytest\n", "tests.drafters", False),
    ("from . import cli\n", "tests.helpers", False),
])
def test_the_check_finds_an_import_of_a_test_module_wherever_it_is(source, package, expected):
    assert any(is_test_module(name) for _, name in imported_modules(ast.parse(source), package)) == expected
