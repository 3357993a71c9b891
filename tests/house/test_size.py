"""Size is a tested property of the house: a function fits a screen (at most 60 lines) and a file does
one job (at most 500 lines), in the package, the benchmarks and the tests (Python) and in the compiled
kernel's C++ sources (`specdraft/backend/native/csrc`), with a short list of named exceptions, each
with its reason. A function or file that grows past its limit is several."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("specdraft", "benchmarks", "tests")
CPP = ROOT / "specdraft" / "backend" / "native" / "csrc"
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


def cpp_files() -> list[Path]:
    return sorted(path for pattern in ("*.cpp", "*.h") for path in CPP.glob(pattern))


# A column-0 line that starts no function: a preprocessor line, a comment, a closing brace, or a
# declaration of something else (a template's parameters come on the line before its function).
NOT_A_FUNCTION = re.compile(r"#|//|/\*|\*|}|(namespace|template|struct|class|union|enum|using|typedef|static_assert)\b")


def _code(line: str) -> str:
    return line.split("//", 1)[0].rstrip()


def cpp_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function of clang-format-style C++ (nothing indented inside a namespace):
    from its signature's first line (a column-0 line, the signature maybe over several lines, ending
    in `{`) to the next line that starts with `}`. A one-line function, a declaration (`;`) and a
    variable (`=` before the first parenthesis) are not counted."""
    lines, found, i = source.splitlines(), [], 0
    while i < len(lines):
        if not lines[i][:1].strip() or NOT_A_FUNCTION.match(lines[i]):  # blank, indented or not a function
            i += 1
            continue
        end, signature = i, _code(lines[i])
        while not signature.endswith(("{", ";", "}")) and end + 1 < len(lines):
            end += 1
            signature += " " + _code(lines[end]).strip()
        head = signature.split("(", 1)[0]
        if signature.endswith("{") and "(" in signature and "=" not in head:
            close = next((j for j in range(end + 1, len(lines)) if lines[j].startswith("}")), len(lines) - 1)
            name = re.search(r"([\w:~]+(?:<[^<>]*>)?)\s*$", head)
            found.append((name.group(1) if name else head.strip(), close - i + 1))
            end = close
        i = end + 1
    return found


def sizes() -> list[tuple[str, int, list[tuple[str, int]]]]:
    """(where, lines, its functions' (name, lines)) of every Python and C++ file the rule covers."""
    out = []
    for path in python_files():
        source = path.read_text()
        where = str(path.relative_to(ROOT))
        out.append((where, len(source.splitlines()), list(functions(ast.parse(source, where)))))
    for path in cpp_files():
        source = path.read_text()
        out.append((str(path.relative_to(ROOT)), len(source.splitlines()), cpp_functions(source)))
    return out


def oversized() -> list[str]:
    found = []
    for where, lines, measured in sizes():
        if lines > MAX_FILE_LINES and where not in EXCEPTIONS:
            found.append(f"{where}: {lines} lines (at most {MAX_FILE_LINES})")
        for name, length in measured:
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


BODY = "  x += 1;\n"


@pytest.mark.parametrize("source, expected", [
    ("void f() {\n" + BODY * 59 + "}\n", ["f: 61"]),
    ("void f() {\n" + BODY * 58 + "}\n", []),
    ("inline void g(const float* x,  // why\n              int64_t n) {\n" + BODY * 58 + "}\n", ["g: 61"]),
    ("template <int64_t KIND>\n[[gnu::noinline]] void h(int64_t n) {  // as `g`\n" + BODY * 59 + "}\n", ["h: 61"]),
    ("template <>\ninline void k<Q4_1>(int n) {\n" + BODY * 59 + "}\n", ["k<Q4_1>: 61"]),
    ("inline int one() { return 1; }\nextern \"C\" void e(int n) {\n" + BODY * 59 + "}\n", ["e: 61"]),
    ("namespace {\nconstexpr int64_t kTable[2] = {\n" + "  1,\n" * 70 + "};\ntemplate <int N>\nstruct S {\n"
     + "  int x;\n" * 70 + "};\nvoid declared(int n);\n}  // namespace\n", []),
])
def test_the_cpp_measure_counts_a_function_from_its_signature_to_its_closing_brace(source, expected):
    measured = [f"{name}: {length}" for name, length in cpp_functions(source) if length > MAX_FUNCTION_LINES]
    assert measured == expected
