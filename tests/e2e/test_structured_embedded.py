"""Structured output on the embedded SmolLM2: a function-calling schema and JSON mode give the same
tokens with every drafter as with `none`, and every whole output validates; through the library and
the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from specdraft import LLM, ResponseFormat, SamplingParams, SpeculationParams

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
REQUESTS = [
    "Call get_weather(city, unit, days) for a three-day forecast in Lisbon, in celsius. Reply with JSON only.",
    "What will the weather be in Osaka tomorrow, in fahrenheit? Answer with a get_weather call as JSON.",
    "Extract the city and the temperatures from: 'Toronto hit 21 C on Monday and 24 C on Tuesday.' as JSON.",
]


@pytest.fixture(scope="module")
def llm(embedded):
    return LLM(embedded, drafters=["none", "ngram", "hybrid", "model"], k=5, max_batch=4)


@pytest.mark.parametrize("fmt", ["schema", "object"])
def test_every_drafter_gives_the_constrained_output_of_none(llm, fmt):
    response_format = ResponseFormat.json_schema(CALL) if fmt == "schema" else ResponseFormat.json_object()
    params = SamplingParams(max_tokens=70, response_format=response_format)
    messages = [[{"role": "user", "content": text}] for text in REQUESTS]
    plain = llm.chat(messages, params, SpeculationParams("none"))
    assert any(out.finish_reason == "stop" for out in plain)
    for out in plain:
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), CALL if fmt == "schema" else {"type": "object"})
            assert out.metrics.grammar.complete is True
    for drafter in ("ngram", "hybrid", "model"):
        for speculative, reference in zip(llm.chat(messages, params, SpeculationParams(drafter, policy="fixed")), plain):
            assert speculative.token_ids == reference.token_ids, drafter
            assert speculative.metrics.draft_tokens > 0


def test_forced_tokens_make_ngram_take_fewer_steps(llm):
    params = SamplingParams(max_tokens=70, response_format=ResponseFormat.json_schema(CALL))
    messages = [{"role": "user", "content": REQUESTS[0]}]
    [plain] = llm.chat(messages, params, SpeculationParams("none"))
    [ngram] = llm.chat(messages, params, SpeculationParams("ngram"))
    assert ngram.token_ids == plain.token_ids
    assert ngram.metrics.grammar.forced_accepted_tokens >= len('{"name": "get_weather", "arguments": {"') // 4
    assert ngram.metrics.steps < 0.75 * plain.metrics.steps


def test_cli_json_schema_and_its_errors(tmp_path):
    schema, bad = tmp_path / "call.json", tmp_path / "bad.json"
    schema.write_text(json.dumps(CALL))
    bad.write_text('{"type": "objekt"}')
    run = lambda *args: subprocess.run([sys.executable, "-m", "specdraft.api.cli", "generate", *args], capture_output=True,
                                       text=True, timeout=600)
    ok = run(REQUESTS[0], "--json-schema", str(schema), "--max-tokens", "70", "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    if out["finish_reason"] == "stop":
        jsonschema.validate(json.loads(out["text"]), CALL)
    refused = run("hi", "--json-schema", str(bad))
    assert refused.returncode == 1 and "response_format: the JSON schema cannot be used: Invalid type: objekt" in refused.stderr
    assert "Traceback" not in refused.stderr
    short = run(REQUESTS[0], "--json-object", "--max-tokens", "4")
    assert short.returncode == 0 and "before its JSON was complete" in short.stderr
