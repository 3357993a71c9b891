"""The house's layout, read from the imports: no circles, no import that runs back up the floors (api
-> runtime/service -> engine -> verifier, drafters (siblings) -> models/sampling -> backend/params/policy),
a decode step's stages never reach back into the loop, the engine tells the policy what happened
through one method, and no string-keyed read of a request's metrics is left."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specdraft"
FLOORS = {  # higher imports lower; a module's floor is its first listed prefix's
    "specdraft.api": 7, "specdraft.llm": 7,
    "specdraft.runtime": 6, "specdraft.settings": 6, "specdraft.service": 6, "specdraft.metrics": 6,
    "specdraft.engine": 5,
    "specdraft.integrations": 4,
    "specdraft.verifier": 3, "specdraft.drafters": 3,  # siblings: the engine joins them, neither imports the other
    "specdraft.models": 2, "specdraft.grammar": 2, "specdraft.sampling": 2,  # models/: find, plan, load, pair
    # the backend's packages: the kernel wing (GGUF blocks and the compiled kernel) and numba's layers
    "specdraft.backend.native": 1, "specdraft.backend.numba_layers": 1,
    "specdraft.backend": 1, "specdraft.params": 1, "specdraft.policy": 1, "specdraft.errors": 1,
    "specdraft.draft": 1, "specdraft.results": 1,
    "specdraft.threads": 1, "specdraft.text": 1, "specdraft.splitmix": 1,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """The specdraft modules a file imports (type-checking-only imports left out); `from pkg import
    sub` names the submodule where `sub` is one."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING" for node in ast.walk(block)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("specdraft")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdraft"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
    return {name for name in out if name in MODULES}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def floor(name: str) -> int:
    if name == "specdraft":
        return 8
    return next(level for prefix, level in FLOORS.items() if name == prefix or name.startswith(prefix + "."))


def placed(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in FLOORS)


def test_every_module_has_a_floor():
    unplaced = sorted(name for name in MODULES if name != "specdraft" and not placed(name))
    assert unplaced == [], f"modules with no floor in FLOORS: {unplaced}"


def test_no_import_runs_back_up():
    upward = [(a, b) for a, targets in GRAPH.items() for b in targets if floor(b) > floor(a)]
    assert upward == []


def test_the_verifier_and_the_drafters_never_import_each_other():
    """A draft crosses between them as a value (`specdraft.draft.Draft`), through the engine's step."""
    room = lambda module: module.split(".")[1] if "." in module else module  # noqa: E731
    crossing = [(a, b) for a, targets in GRAPH.items() for b in targets if {room(a), room(b)} == {"verifier", "drafters"}]
    assert crossing == []


def test_no_circles():
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            assert state.get(target) != 1, " -> ".join([*path, name, target])
            if target not in state:
                visit(target, [*path, name])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])


def test_the_kernel_wing_imports_no_layer_above_it():
    """`backend.native` (GGUF blocks, the compiled kernel) is read by the layers; it reads none of them
    (a model's `backend.family`, pure data, it reads)."""
    allowed = ("specdraft.backend.native", "specdraft.backend.linear", "specdraft.backend.family", "specdraft.params")
    found = sorted((a, b) for a, targets in GRAPH.items() if a.startswith("specdraft.backend.native")
                   for b in targets if not any(b == prefix or b.startswith(prefix + ".") for prefix in allowed))
    assert found == []


def test_the_kernel_wing_reads_no_model_module_even_to_type_check():
    """The layout a GGUF's check returns is the wing's own value (`backend.native.layout.GgufLayout`):
    `models.gguf_check` makes it and hands it down, so not even a type-checking import reaches up."""
    found = sorted((name, node.module) for name, path in MODULES.items() if name.startswith("specdraft.backend.native")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdraft.models"))
    assert found == []


def test_the_steps_stages_never_import_the_loop():
    for name in ("specdraft.engine.step", "specdraft.engine.constrain", "specdraft.engine.calibrate",
                 "specdraft.engine.requests"):
        assert "specdraft.engine.engine" not in GRAPH[name] and "specdraft.engine" not in GRAPH[name], name


def test_the_engine_asks_the_policy_and_tells_it_what_happened_in_one_place():
    """The loop asks the policy through its questions and tells it what happened through `record`,
    called at one place in the loop (calibration, before any request, tells it its measurements);
    `tests/engine/test_engine.py` counts one `record` a step as the engine runs."""
    calls: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if name == "policy":
                    calls.setdefault(node.func.attr, []).append(f"{path.name}:{node.lineno}")
    assert set(calls) <= {"begin", "end", "worth_calling", "choose", "record"}, calls
    assert [site for site in calls.get("record", []) if not site.startswith("calibrate.py")] == [
        site for site in calls["record"] if site.startswith("engine.py")] and len(
        [site for site in calls["record"] if site.startswith("engine.py")]) == 1, calls["record"]


def test_no_metrics_are_read_by_string_key():
    pattern = re.compile(r"""metrics(\.get\(|\[)["']""")
    found = [f"{path.relative_to(ROOT)}:{i}" for directory in ("specdraft", "benchmarks")
             for path in (ROOT / directory).rglob("*.py")
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
