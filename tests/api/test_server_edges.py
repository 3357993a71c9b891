"""The server's edges, on a tiny model (fast): every bad field is a 4xx in OpenAI's error format,
admission is bounded (429, never a hang), the cross-request memory is saved and reloaded, and a
bounded fuzz run against the OpenAPI schema finds no 5xx."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest

from benchmarks.common import live_server
from tests.helpers.tiny_dir import tiny_model_dir

pytestmark = pytest.mark.subprocess

MODEL = "tiny-llama"
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OK_COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 4}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp(MODEL))


@pytest.fixture(scope="module")
def server(tiny_dir):
    with live_server("--model", str(tiny_dir), "--served-model-name", MODEL, "--max-model-len", "256",
                     "--max-batch-size", "4", "--drafters", "none,ngram") as url:
        yield url


BAD = [
    # (endpoint, body change, status, message part, param)
    ("chat", {"max_tokens": "5"}, 400, "max_tokens: Input should be a valid integer", "max_tokens"),
    ("chat", {"max_tokens": -3}, 400, "max_tokens: Input should be greater than or equal to 1", "max_tokens"),
    ("chat", {"max_tokens": 10**9}, 400, "at most", "max_tokens"),
    ("chat", {"max_completion_tokens": 0}, 400, "max_completion_tokens: Input should be greater than or equal to 1", None),
    ("chat", {"temperature": 3}, 400, "temperature: Input should be less than or equal to 2", "temperature"),
    ("chat", {"temperature": "hot"}, 400, "temperature: Input should be a valid number", "temperature"),
    ("chat", {"top_p": 0}, 400, "top_p: Input should be greater than 0", "top_p"),
    ("chat", {"top_k": -5}, 400, "top_k: Input should be greater than or equal to -1", "top_k"),
    ("chat", {"seed": -1}, 400, "seed: Input should be greater than or equal to 0", "seed"),
    ("chat", {"n": 2}, 400, "n: must be 1", "n"),
    ("chat", {"stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4 stop strings, got 5", "stop"),
    ("chat", {"stop": [""]}, 400, "stop strings must be non-empty", "stop"),
    ("chat", {"top_logprobs": 2}, 400, "top_logprobs: needs logprobs set to true", "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 0}, 400, "top_logprobs: needs logprobs set to true", "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs: Input should be less than or equal to 20",
     "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, 400, "top_logprobs: Input should be greater than or equal to 0",
     "top_logprobs"),
    ("chat", {"logprobs": 1}, 400, "logprobs: Input should be a valid boolean", "logprobs"),
    ("completion", {"logprobs": 6}, 400, "logprobs: Input should be less than or equal to 5", "logprobs"),
    ("completion", {"logprobs": -1}, 400, "logprobs: Input should be greater than or equal to 0", "logprobs"),
    ("completion", {"logprobs": True}, 400, "logprobs: Input should be a valid integer", "logprobs"),
    ("chat", {"tools": [{"type": "function"}]}, 400, "tools: is not supported", "tools"),
    ("chat", {"frequency_penalty": 0.5}, 400, "frequency_penalty: is not supported", "frequency_penalty"),
    ("chat", {"surprise": 1}, 400, "surprise: unknown field", "surprise"),
    ("chat", {"messages": []}, 400, "messages: List should have at least 1 item", "messages"),
    ("chat", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role: Input should be", None),
    ("chat", {"messages": [{"role": "user"}]}, 400, "messages.0.content: is required", None),
    ("chat", {"model": "gpt-9"}, 404, "the model 'gpt-9' does not exist here", "model"),
    ("chat", {"speculation": {"drafter": "magic"}}, 400, "drafter 'magic' is not available here", "speculation"),
    ("chat", {"speculation": {"drafter": "model"}}, 400, "drafter 'model' is not available here; choose one of: ngram, none", "speculation"),
    ("chat", {"speculation": {"num_speculative_tokens": 99}}, 400, "must be between 0 and 64", None),
    ("chat", {"speculation": {"num_speculative_tokens": 9}}, 400, "num_speculative_tokens 9 is above this engine's maximum of 5", "speculation"),
    ("chat", {"speculation": {"k": 3}}, 400, "speculation.k: unknown field", "speculation.k"),
    ("chat", {"stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage: Input should be a valid boolean", None),
    ("completion", {"prompt": "x " * 400}, 400, "this model's context is 256 tokens", "prompt"),
    ("completion", {"prompt": ["a", "b"]}, 400, "give one prompt per request, got 2", "prompt"),
    ("completion", {"prompt": [1, 2, 10**7]}, 400, "token id 10000000 is outside the vocabulary", "prompt"),
    ("completion", {"prompt": []}, 400, "prompt is empty", "prompt"),
    ("completion", {"prompt": "   "}, 400, "prompt is empty", "prompt"),
    ("completion", {"echo": True}, 400, "echo: is not supported", "echo"),
    ("completion", {"prompt": None}, 400, "prompt: has the wrong type (input should be a valid string", "prompt"),
    ("completion", {"prompt": [1.5]}, 400, "prompt: has the wrong type", "prompt"),
    ("chat", {"response_format": {"type": "xml"}}, 400, "response_format: Input tag 'xml' found", None),
    ("chat", {"response_format": {"type": "json_schema"}}, 400, "response_format.json_schema.json_schema: is required", None),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
     "response_format.json_schema.json_schema.schema: is required", None),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}, 400,
     "response_format: the JSON schema cannot be used: Invalid type: objekt", "response_format"),
    ("completion", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/no"}}}}, 400,
     "Pointer '/no' does not exist", "response_format"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, 400,
     "response_format.json_schema.json_schema.name: String should match pattern", None),
]


@pytest.mark.parametrize("endpoint, change, status, message, param", BAD, ids=[f"{e}-{sorted(c)[0]}-{i}" for i, (e, c, *_ ) in enumerate(BAD)])
def test_bad_input_is_a_4xx_in_openai_format(server, endpoint, change, status, message, param):
    body = {**(OK_CHAT if endpoint == "chat" else OK_COMPLETION), **change}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    response = httpx.post(f"{server}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize("raw, message", [(b"{not json", "the body is not valid JSON"), (b"[]", "Input should be a valid dictionary")])
def test_bad_json_is_a_400(server, raw, message):
    response = httpx.post(f"{server}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and message in response.json()["error"]["message"]


def test_unknown_route_is_a_404_in_openai_format(server):
    response = httpx.get(f"{server}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_good_requests_still_work(server):
    for path, body in (("/v1/chat/completions", OK_CHAT), ("/v1/completions", OK_COMPLETION)):
        response = httpx.post(f"{server}{path}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("endpoint, change, param", [
    ("completion", {"prompt": "x " * 400}, "prompt"),
    ("completion", {"prompt": [5] * 256}, "prompt"),
    ("chat", {"messages": [{"role": "user", "content": "x " * 400}], "max_tokens": None}, "messages"),
    ("chat", {"max_tokens": 10**9}, "max_tokens"),
])
def test_what_the_context_cannot_hold_is_context_length_exceeded(server, endpoint, change, param):
    """The engine's intake check refuses a prompt that leaves no room (naming the field it came in);
    a max_tokens beyond the room left is refused too, as OpenAI does: both with OpenAI's code."""
    body = {**(OK_CHAT if endpoint == "chat" else OK_COMPLETION), **change}
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    response = httpx.post(f"{server}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error
    assert "this model's context is 256" in error["message"]


def test_admission_is_bounded_with_429_never_a_hang(tiny_dir):
    with live_server("--model", str(tiny_dir), "--served-model-name", MODEL, "--max-model-len", "256",
                     "--max-batch-size", "1", "--max-queue", "1", "--drafters", "none") as url:

        async def one(client):
            body = {**OK_COMPLETION, "max_tokens": 240, "prompt": "a"}
            response = await client.post(f"{url}/v1/completions", json=body, timeout=120)
            return response.status_code, response.json()

        async def burst():
            async with httpx.AsyncClient() as client:
                return await asyncio.gather(*(one(client) for _ in range(8)))

        results = asyncio.run(burst())
        statuses = sorted(status for status, _ in results)
        assert statuses.count(200) >= 2 and statuses.count(429) >= 1, statuses
        refused = next(body for status, body in results if status == 429)
        assert refused["error"]["code"] == "rate_limit_exceeded" and "at capacity" in refused["error"]["message"]
        assert set(statuses) <= {200, 429}


def test_ngram_memory_is_saved_at_shutdown_and_loaded_again(tiny_dir, tmp_path):
    from specdraft.drafters.memory import NgramMemory

    path = tmp_path / "memory.npz"
    prompts = ["The order: alpha, beta, gamma.", "The order: alpha, beta, gamma, delta."]
    with live_server("--model", str(tiny_dir), "--served-model-name", MODEL, "--max-model-len", "256",
                     "--drafters", "ngram", "--ngram-memory", str(path)) as url:
        for prompt in prompts:
            assert httpx.post(f"{url}/v1/completions", json={**OK_COMPLETION, "prompt": prompt, "max_tokens": 24,
                                                             "temperature": 0}, timeout=60).status_code == 200
    saved = NgramMemory.load(path)
    assert saved.entries > 0
    with live_server("--model", str(tiny_dir), "--served-model-name", MODEL, "--max-model-len", "256",
                     "--drafters", "ngram", "--ngram-memory", str(path)) as url:
        assert httpx.get(f"{url}/health").status_code == 200
    reloaded = NgramMemory.load(path)
    assert reloaded.entries == saved.entries and np.array_equal(reloaded.keys, saved.keys)


@pytest.mark.slow
def test_fuzzing_the_openapi_schema_finds_no_server_error(server):
    """A bounded schemathesis run (loopback only) with the check that no response is a 5xx."""
    pytest.importorskip("schemathesis", reason="the fuzz run needs schemathesis (a test dependency: pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{server}/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "40", "--workers", "1", "--request-timeout", "60", "--seed", "1",
         "--phases", "examples,coverage,fuzzing", "--no-color", "--suppress-health-check", "all"],
        capture_output=True, text=True, timeout=900,
    )
    summary = re.search(r"^.*?(\d+) generated, (\d+) passed.*$", proc.stdout, re.MULTILINE)
    assert proc.returncode == 0 and summary and "fail" not in summary.group(0), proc.stdout[-4000:] + proc.stderr[-2000:]
    assert int(summary.group(2)) >= 100  # cases actually sent, each answered without a 5xx
