"""Third-party drafters: the example package (`examples/specdraft-copycat`), installed by the test
with its entry point, works wherever a built-in drafter does (the registry, the CLI, the server per
request through the `openai` client, the library, the benchmark, the vLLM proposer), with greedy
output equal to `none`'s and drafts verified. A plugin that fails to import or to build, or whose
name is taken, is named in a warning and the others load; unknown options are refused by name."""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import subprocess
import sys
import tomllib
from contextlib import ExitStack, contextmanager
from importlib.util import find_spec
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI

from specdraft.drafters import (create_drafter, drafter_names, drafter_option_defaults, drafter_origin, is_builtin,
                                load_plugins, needs_target, plugin_errors)
from specdraft.params import SamplingParams, SpeculationParams
from benchmarks.common import live_server
from tests.helpers.tiny_dir import tiny_model_dir

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "specdraft-copycat"
ORIGIN = "plugin: specdraft-copycat (specdraft_copycat:create)"
PROMPT = "Copy this list twice: apple, banana, cherry, grape, lemon, mango."
LIST = "Fruit: apple, banana, cherry, grape, lemon, mango.\nFruit: apple, banana, cherry, grape, lemon, mango.\nFruit:"
# A throwaway package: a plugin that cannot be imported, one that cannot be built, one that takes a built-in's name.
BROKEN = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "specdraft-broken"
version = "0.0.1"

[project.entry-points."specdraft.drafters"]
broken-import = "specdraft_broken_import:create"
broken-build = "specdraft_broken_build:create"
ngram = "specdraft_broken_build:create"

[tool.setuptools]
py-modules = ["specdraft_broken_import", "specdraft_broken_build"]
""",
    "specdraft_broken_import.py": 'raise ImportError("this plugin cannot be imported")\n',
    "specdraft_broken_build.py": 'def create(k: int):\n    raise RuntimeError("this plugin cannot be built")\n',
}


def pip_install(source: Path, target: Path) -> Path:
    """`pip install --target` a package, built from a copy of `source` (so the build leaves nothing there)."""
    copy = target.with_name(target.name + "-source")
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    isolation = ["--no-build-isolation"] if find_spec("setuptools") else []  # without setuptools here, pip fetches it
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
                           "--target", str(target), str(copy)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return target


@contextmanager
def on_path(*directories: Path):
    """Import from `directories` here (sys.path) and in subprocesses (PYTHONPATH); the registry looks
    for plugins again on entry and on exit."""
    with pytest.MonkeyPatch.context() as patch:
        for directory in reversed(directories):
            patch.syspath_prepend(str(directory))
        patch.setenv("PYTHONPATH", os.pathsep.join([*map(str, directories), *filter(None, [os.environ.get("PYTHONPATH")])]))
        load_plugins(rescan=True)
        yield
    load_plugins(rescan=True)


@pytest.fixture(scope="session")
def copycat_dir(tmp_path_factory):
    return pip_install(EXAMPLE, tmp_path_factory.mktemp("plugins") / "copycat")


@pytest.fixture(scope="session")
def broken_dir(tmp_path_factory):
    source = tmp_path_factory.mktemp("specdraft-broken")
    for name, text in BROKEN.items():
        (source / name).write_text(text)
    return pip_install(source, tmp_path_factory.mktemp("plugins") / "broken")


@pytest.fixture(scope="module")
def copycat(copycat_dir):
    """The example installed and found: `copycat` is a drafter name here and in subprocesses."""
    with on_path(copycat_dir):
        yield


@pytest.fixture
def broken(copycat, broken_dir, caplog):
    """The broken package installed beside the example; yields the warnings its discovery logged."""
    with caplog.at_level(logging.WARNING, logger="specdraft"), on_path(broken_dir):
        yield [record.getMessage() for record in caplog.records]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


def specdraft(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, "-m", "specdraft.api.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


# -- the example and the registry ------------------------------------------------------------------
def test_the_example_is_a_small_package_written_against_the_four_verbs_alone():
    source = (EXAMPLE / "specdraft_copycat.py").read_text()
    assert len(source.splitlines()) < 40
    tree = ast.parse(source)
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {name for name in imported if name.startswith("specdraft")} == {"specdraft.drafters.base", "specdraft.params"}
    [drafter] = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    public = {node.name for node in drafter.body if not getattr(node, "name", "_").startswith("_")}
    assert public == {"begin", "propose", "accept", "end"}
    assert not [node for node in drafter.body if isinstance(node, (ast.Assign, ast.AnnAssign))]  # declares nothing more
    entry_points = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry_points == {"specdraft.drafters": {"copycat": "specdraft_copycat:create"}}


def test_the_registry_finds_the_installed_plugin(copycat):
    assert "copycat" in drafter_names() and plugin_errors() == {}
    assert drafter_origin("copycat") == ORIGIN and drafter_origin("ngram") == "built-in"
    assert not is_builtin("copycat") and is_builtin("ngram")
    assert drafter_option_defaults("copycat") == {} and not needs_target("copycat")


@pytest.mark.parametrize(
    "prompt, accepted, limit, expected",
    [
        ([5, 6, 7, 5], [], 4, [6, 7, 5]),  # what followed the previous 5, up to the end of the context
        ([5, 6, 7, 5], [], 2, [6, 7]),
        ([5, 6, 5, 7, 5], [], 4, [7, 5]),  # the latest previous occurrence
        ([5, 6, 7, 8], [], 4, []),  # 8 never came before
        ([5], [], 4, []),
        ([5, 5, 5], [], 4, [5]),
        ([1, 2, 3], [4, 1], 3, [2, 3, 4]),  # accepted tokens join the context
        ([1, 2, 3], [1, 9], 3, []),
        ([5, 6, 7, 5], [], 0, []),
    ],
)
def test_copycat_drafts_what_followed_the_last_tokens_previous_occurrence(copycat, prompt, accepted, limit, expected):
    drafter = create_drafter("copycat", k=4)
    drafter.begin("r", prompt, SamplingParams())
    drafter.accept("r", accepted)
    [draft] = drafter.propose(["r"], [limit])
    assert draft.token_ids.dtype == np.int32 and draft.token_ids.tolist() == expected and draft.probs is None
    drafter.end("r")


def test_unknown_options_of_a_plugin_are_refused_by_name(copycat):
    with pytest.raises(ValueError, match="drafter 'copycat' has no option 'span'; its options: none"):
        create_drafter("copycat", k=4, span=2)
    proc = specdraft("generate", "hi", "--drafter", "copycat", "--drafter-options", '{"copycat": {"span": 2}}')
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("specdraft: error: argument --drafter-options: drafter 'copycat' has no option 'span'; "
                                   "its options: none")


def test_a_plugin_that_fails_is_named_and_the_others_load(broken):
    errors = plugin_errors()
    assert errors["broken-import"] == ("plugin: specdraft-broken (specdraft_broken_import:create): "
                                       "ImportError: this plugin cannot be imported")
    assert errors["ngram"] == "plugin: specdraft-broken (specdraft_broken_build:create): the name 'ngram' is taken by a built-in drafter"
    assert set(errors) == {"broken-import", "ngram"}  # broken-build imports; it fails only when built
    assert any("'broken-import' is left out" in message and "ImportError" in message for message in broken)
    assert {"copycat", "broken-build", "ngram"} <= set(drafter_names()) and "broken-import" not in drafter_names()
    assert drafter_origin("ngram") == "built-in"
    with pytest.raises(ValueError, match="drafter 'broken-import' was left out: .*ImportError"):
        create_drafter("broken-import", k=4)
    with pytest.raises(RuntimeError, match="this plugin cannot be built"):
        create_drafter("broken-build", k=4)


def test_drafters_command_lists_every_drafter_its_origin_and_options(broken):
    proc = specdraft("drafters")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[lines.index(f"copycat  ({ORIGIN})") + 1] == "  options: none"
    assert lines[lines.index("prompt-lookup-scan  (built-in)") + 1] == "  options: min_n=1, max_n=3"
    assert "ngram  (built-in)" in lines and "max_n=4" in lines[lines.index("ngram  (built-in)") + 1]
    left_out = lines[lines.index("left out:") + 1 :]
    assert any(line.startswith("  broken-import  plugin: specdraft-broken") and "ImportError" in line for line in left_out)
    assert "specdraft: warning: drafter plugin 'broken-import' is left out" in proc.stderr


# -- the CLI ---------------------------------------------------------------------------------------
class Built(Exception):
    """Raised by a stand-in for `build_runtime`: the CLI got as far as building, with these settings."""


@pytest.fixture
def build_keywords(monkeypatch):
    import specdraft.llm
    import specdraft.runtime

    def capture(model, settings):
        raise Built(vars(settings))  # each field by name

    monkeypatch.setattr(specdraft.runtime, "build_runtime", capture)
    monkeypatch.setattr(specdraft.llm, "build_runtime", capture)  # generate builds through `LLM`

    def run(*argv: str) -> dict:
        from specdraft.api.cli import main

        with pytest.raises(Built) as built:
            main(list(argv))
        return built.value.args[0]

    return run


def test_generate_passes_drafter_options_and_policy_through(copycat, build_keywords):
    keywords = build_keywords("generate", "hi", "--drafter", "copycat", "--policy", "fixed", "-k", "3",
                              "--drafter-options", '{"copycat": {}}')
    assert keywords["drafter"] == "copycat" and keywords["policy"] == "fixed" and keywords["k"] == 3
    assert keywords["drafter_options"] == {"copycat": {}}
    assert build_keywords("generate", "hi")["policy"] == "auto"


def test_serve_offers_every_plugin_and_gives_the_ngram_memory_to_ngram_options(copycat, build_keywords, tmp_path):
    keywords = build_keywords("serve", "--policy", "fixed", "--drafter-options", '{"ngram": {"max_n": 3}}',
                              "--ngram-memory", str(tmp_path / "memory.npz"))
    assert keywords["drafters"] == ["ngram", "none", "model", "hybrid", "copycat"] and keywords["drafter"] is None
    assert keywords["policy"] == "fixed"
    assert keywords["drafter_options"] == {"ngram": {"max_n": 3, "memory": True, "memory_path": str(tmp_path / "memory.npz")}}
    keywords = build_keywords("serve", "--drafters", "none,hybrid", "--drafter", "copycat", "--ngram-memory")
    assert keywords["drafters"] == ["copycat", "none", "hybrid"] and keywords["drafter"] == "copycat"
    assert keywords["drafter_options"] == {"ngram": {"memory": True}}  # hybrid's n-gram part takes ngram's options


@pytest.mark.slow
def test_generate_with_the_plugin_equals_none_and_verifies_drafts(copycat, tiny_dir):
    def generate(*args: str) -> dict:
        proc = specdraft("generate", PROMPT, "--model", str(tiny_dir), "--max-tokens", "32", "--json", *args)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    plain = generate("--drafter", "none")
    for policy in ("auto", "fixed"):
        out = generate("--drafter", "copycat", "--policy", policy)
        assert out["token_ids"] == plain["token_ids"] and out["text"] == plain["text"]
        assert out["metrics"]["drafter"] == "copycat"
        assert out["metrics"]["draft_tokens"] > 0 and out["metrics"]["accepted_tokens"] > 0, (policy, out["metrics"])


# -- the server ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(copycat, tiny_dir, broken_dir, tmp_path_factory):
    """The default drafters on the tiny model, with the broken package installed too; yields (url, log)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ExitStack() as stack:
        with on_path(broken_dir):  # for the server's start only
            url = stack.enter_context(live_server("--model", str(tiny_dir), "--served-model-name", "tiny",
                                                  "--max-model-len", "256", "--max-batch-size", "2", log=log))
        yield url, log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.slow
def test_server_names_the_plugins_left_out_and_serves_the_others(server):
    url, log = server
    assert "specdraft: warning: drafter plugin 'broken-import' is left out" in log
    assert "'broken-build'" in log and "this plugin cannot be built" in log
    [model] = httpx.get(f"{url}/v1/models").json()["data"]  # the playground's drafter list
    assert model["drafters"] == ["copycat", "hybrid", "model", "ngram", "none"]


@pytest.mark.slow
def test_server_runs_the_plugin_per_request(client):
    def chat(speculation: dict) -> tuple[str, dict]:
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=32,
                                               temperature=0, extra_body={"speculation": speculation})
        return reply.choices[0].message.content, reply.usage.model_extra["speculation"]

    plain, _ = chat({"drafter": "none"})
    for policy in ("auto", "fixed"):
        text, stats = chat({"drafter": "copycat", "policy": policy})
        assert text == plain
        assert stats["drafter"] == "copycat" and stats["draft_tokens"] > 0 and stats["accepted_tokens"] > 0, stats


@pytest.mark.slow
def test_server_refuses_an_unknown_policy_by_name(server):
    reply = httpx.post(f"{server[0]}/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                            "speculation": {"drafter": "copycat", "policy": "greedy"}})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "speculation.policy" and "'auto' or 'fixed'" in error["message"]


# -- the library, the benchmark, vLLM --------------------------------------------------------------
@pytest.mark.slow
def test_library_runs_the_plugin(copycat, embedded):
    from specdraft import LLM

    llm = LLM(embedded, drafters=["none", "copycat"], calibrate=False)
    [plain] = llm.generate(LIST, SamplingParams(max_tokens=24), SpeculationParams("none"))  # real text that copies
    for policy in ("auto", "fixed"):
        [out] = llm.generate(LIST, SamplingParams(max_tokens=24), SpeculationParams("copycat", policy=policy))
        assert out.token_ids == plain.token_ids and out.text == plain.text
        assert out.metrics.draft_tokens > 0 and out.metrics.accepted_tokens > 0, (policy, out.metrics)


def test_library_refuses_unknown_options_of_a_plugin_by_name(copycat, tiny_dir):
    from specdraft import LLM

    with pytest.raises(ValueError, match="drafter 'copycat' has no option 'span'"):
        LLM(str(tiny_dir), drafters=["none", "copycat"], drafter_options={"copycat": {"span": 2}}, calibrate=False)


@pytest.mark.slow
def test_benchmark_measures_the_plugin(copycat, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.domains.run", "--drafters", "none,copycat", "--domains", "json",
                           "--prompts", "1", "--max-tokens", "16", "--repeat-slow", "0", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = {cell["method"]: cell for cell in json.loads((tmp_path / "results.json").read_text())["cells"]}
    assert {"specdraft-none", "specdraft-copycat"} <= set(cells)
    assert all(row["lossless"] for row in cells["specdraft-copycat"]["prompts"])
    assert "specdraft-copycat" in (tmp_path / "results.md").read_text()


def test_vllm_proposer_runs_a_plugin_named_in_additional_config(copycat):
    from specdraft.integrations.vllm import Proposer
    from tests.helpers.vllm_config import fake_vllm_config

    proposer = Proposer(fake_vllm_config(k=3, additional_config={"specdraft": {"drafter": "copycat"}}))
    assert proposer.drafter_name == "copycat"
    tokens = np.zeros((1, 256), dtype=np.int32)
    context = [1, 2, 3, 4, 1]
    tokens[0, : len(context)] = context
    assert proposer.propose([[1]], np.array([len(context)]), tokens) == [[2, 3, 4]]
    options = {"specdraft": {"drafter": "copycat", "options": {"span": 2}}}
    with pytest.raises(ValueError, match="drafter 'copycat' has no option 'span'"):
        Proposer(fake_vllm_config(additional_config=options))
