"""The documentation holds together: every relative link in README.md, docs/*.md and the benchmarks'
pages (their README, the results' README files and HISTORY.md) reaches a file (and its `#anchor` a
heading of that page, slugged as GitHub does), every docs page is linked from the README, the README
stays short, and its first screen keeps the two commands CI runs. The results lie in folders by subject,
each with its table in the benchmarks' index, none at the top."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
RESULTS_PAGES = [BENCHMARKS / "README.md", RESULTS / "HISTORY.md", *sorted(RESULTS.rglob("README.md"))]
RESULTS_TOP = {"README.md", "HISTORY.md"}  # the only files at the results' top: the reports lie in subject folders
MAX_README_LINES = 300
FIRST_SCREEN = 40  # lines
COMMANDS = ("bash scripts/run.sh", "bash scripts/test.sh")

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"""<a\s[^>]*\b(?:id|name)=["']([^"']+)["']""")


def prose(text: str) -> str:
    """The text with fenced code blocks blanked (a `[x](y)` inside code is not a link)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def links(text: str) -> list[str]:
    """Every link target in the page's prose, code spans and blocks left out (link text may wrap)."""
    return [m.group(1) for m in LINK.finditer(CODE_SPAN.sub("", prose(text)))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but `-` and `_` removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = prose(path.read_text())
    seen: dict[str, int] = {}
    out = set(HTML_ID.findall(text))
    for match in HEADING.finditer(text):
        base = slug(match.group(2))
        n = seen.get(base, 0)  # GitHub numbers repeats: x, x-1, x-2
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that reaches no file, or no heading of its page."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_docs_page_has_a_title_and_a_row_in_the_readme_table():
    """Each docs page opens with its title, and the README's documentation table says what it holds."""
    rows = dict(re.findall(r"^\| \[[^\]]+\]\(docs/([^)#]+)\) \| (.+?) \|$", README.read_text(), re.M))
    assert len(DOCS) >= 10, "docs/*.md"
    assert [p.name for p in DOCS if not p.read_text().startswith("# ")] == []
    assert sorted(p.name for p in DOCS if rows.get(p.name, "").strip() == "") == []


@pytest.mark.parametrize("page", PAGES + RESULTS_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    assert broken_links(page) == []


def test_the_results_pages_are_checked():
    """The results' README and every subject folder's README are among the pages checked above."""
    names = {str(p.relative_to(ROOT)) for p in RESULTS_PAGES}
    assert {"benchmarks/README.md", "benchmarks/results/README.md", "benchmarks/results/HISTORY.md",
            "benchmarks/results/house/README.md"} <= names


def loose_files(folder: Path) -> list[str]:
    """The files at the top of a results folder that are not its README.md and HISTORY.md."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in RESULTS_TOP)


def test_no_report_lies_at_the_top_of_the_results():
    """A report goes into its subject's folder (`benchmarks/README.md`'s index); the top holds the
    results' README and HISTORY.md only."""
    assert loose_files(RESULTS) == []
    assert all((RESULTS / name).is_file() for name in RESULTS_TOP)


def test_the_checker_sees_a_report_at_the_top(tmp_path: Path):
    """Negative control: a run written to the top (its .json and .md) is seen; a subject folder is not."""
    for name in (*RESULTS_TOP, "results.json", "results.md"):
        (tmp_path / name).write_text("")
    (tmp_path / "cpu").mkdir()
    assert loose_files(tmp_path) == ["results.json", "results.md"]


def test_every_subject_folder_has_its_table_in_the_index_and_a_line_in_the_results_readme():
    """The index in benchmarks/README.md has a table per folder of results (a `### `results/<folder>/``
    heading), and the results' README lists each folder; neither names a folder that is not there."""
    folders = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    index = re.findall(r"^### `results/([\w.-]+)/`", (BENCHMARKS / "README.md").read_text(), re.M)
    listed = re.findall(r"^- \[`([\w.-]+)/`\]", (RESULTS / "README.md").read_text(), re.M)
    assert len(folders) >= 5
    assert sorted(index) == folders
    assert sorted(listed) == folders


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / unquote(t.partition("#")[0])).resolve() for t in links(README.read_text())}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_first_screen_has_the_two_commands_and_ci_runs_the_test_one():
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    assert [c for c in COMMANDS if re.search(rf"^{re.escape(c)}\b", first, re.M) is None] == []
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(COMMANDS[1])}\b", ci, re.M), ".ci/run must run the README's test command"


def test_the_checker_sees_a_broken_link_and_anchor(tmp_path: Path):
    """Negative control: the checks fail on a page with a missing file and a missing heading."""
    (tmp_path / "other.md").write_text("# A `Title`, with punctuation!\n\n## Repeat\n\n## Repeat\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-title-with-punctuation) [ok](other.md#repeat-1) [ok](#here)\n"
                    "# Here\n[gone](missing.md) [bad](other.md#nope) `[code](missing.md)`\n"
                    "```\n[fenced](missing.md)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "other.md#nope: no such heading"]


LIFE_SECTIONS = ("The life of a request", "The life of a step")
SCREEN = 30  # lines
NAMED = re.compile(r"`(specdraft/[\w/]+\.py)` `([\w.]+)`")


def section(page: Path, title: str) -> str:
    text = page.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end != -1 else len(text)]


def defined(path: Path, dotted: str) -> bool:
    """Whether `dotted` (a function, or Class.method) is defined in the Python file at `path`."""
    import ast

    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            return False
        scope = found.body
    return True


@pytest.mark.parametrize("title", LIFE_SECTIONS)
def test_the_life_of_a_request_and_of_a_step_fit_a_screen_and_name_real_code(title):
    """docs/architecture.md walks a request and a step stage by stage, each stage by its file and
    function: every one named exists, and each walk fits one screen."""
    text = section(ROOT / "docs" / "architecture.md", title)
    named = NAMED.findall(text)
    assert len(text.splitlines()) <= SCREEN and len(named) >= 8
    assert [f"{path} {name}" for path, name in named if not defined(ROOT / path, name)] == []


def test_a_stage_named_wrongly_is_caught():
    assert defined(ROOT / "specdraft/engine/engine.py", "Engine.step")
    assert not defined(ROOT / "specdraft/engine/engine.py", "Engine.no_such_stage")
    assert not defined(ROOT / "specdraft/engine/engine.py", "Nothing.step")
