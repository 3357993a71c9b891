"""The server's guards, in-process on a tiny random Llama with the embedded model's tokenizer: a body
over the limit is a 413 before it is parsed (declared or counted), text that is not valid Unicode a
400 naming where, an API key on every route but /health (401 in OpenAI's format), a Host header this
server does not answer for a 421, a body that is not JSON a 415, the context checked on a prompt's
characters before tokenizing it where a bound is sound, a schema that refers only to itself a 400;
and `specdraft serve`'s flags reach the app."""

from __future__ import annotations

import base64
import json
import logging
import random

import httpx
import pytest
from fastapi.testclient import TestClient

from specdraft.api import server as server_module
from specdraft.api.gate import DEFAULT_MAX_BODY_BYTES, Access, access_for
from specdraft.api.server import create_app
from specdraft.errors import RequestError
from specdraft.runtime import build_runtime
from specdraft.settings import Settings
from specdraft.text import characters_per_token, check_text, check_unicode
from tests.helpers.tiny_dir import tiny_model_dir

CONTEXT = 256
KEY = "sk-test-key"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def runtime(tiny_dir):
    return build_runtime(str(tiny_dir), Settings(drafters=["none"], max_batch=2, calibrate=False, prefix_cache_mb=0,
                                                 max_context=CONTEXT, device="cpu"))


@pytest.fixture(scope="module")
def tokenizer(runtime):
    return runtime.target.tokenizer


def client_for(runtime, access: Access | None = None, host: str = "localhost") -> TestClient:
    return TestClient(create_app(runtime, access=access), base_url=f"http://{host}")


@pytest.fixture(scope="module")
def client(runtime):
    with client_for(runtime, Access(max_body_bytes=2000)) as client:
        yield client


def openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", error
    return error


# -- the body's size ------------------------------------------------------------------------------
def test_a_body_declared_over_the_limit_is_a_413_before_it_is_parsed(client):
    response = client.post("/v1/completions", content=b"{not json at all" + b" " * 5000,
                           headers={"content-type": "application/json"})
    error = openai_error(response, 413)
    assert "5016 bytes" in error["message"] and "at most 2000" in error["message"]


def test_a_chunked_body_over_the_limit_is_counted_and_a_413(client):
    chunks = (b"{not json" + b" " * 500 for _ in range(10))  # no Content-Length: counted as it arrives
    response = client.post("/v1/completions", content=chunks, headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    assert "more than 2000 bytes" in openai_error(response, 413)["message"]


def test_a_body_under_the_limit_is_served(client):
    response = client.post("/v1/completions", json={**COMPLETION, "prompt": "hello " * 250})  # 1500 bytes, 250 tokens
    assert response.status_code == 200, response.text


def test_the_default_limit_is_4_mib_and_refuses_more(runtime):
    assert Access().max_body_bytes == DEFAULT_MAX_BODY_BYTES == 4 << 20
    with client_for(runtime) as client:
        response = client.post("/v1/completions", content=b" " * (DEFAULT_MAX_BODY_BYTES + 1),
                               headers={"content-type": "application/json"})
    openai_error(response, 413)


# -- text that is not valid Unicode ---------------------------------------------------------------
SURROGATES = [
    # (endpoint, body, where, index)
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "caf\ud800"}]}, "messages[0].content", 3),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "ok"},
                                                                {"type": "text", "text": "\udfff!"}]}]},
     "messages[0].content[1].text", 0),
    ("chat", {**CHAT, "stop": ["fine", "ab\udc80"]}, "stop[1]", 2),
    ("completion", {**COMPLETION, "prompt": "hello \ud83d"}, "prompt", 6),
    ("completion", {**COMPLETION, "prompt": ["x\udce9"]}, "prompt[0]", 1),
    ("completion", {**COMPLETION, "stop": "\ud800"}, "stop", 0),
    ("completion", {**COMPLETION, "user": "me\ud800"}, "user", 2),
]


@pytest.mark.parametrize("endpoint, body, where, index", SURROGATES, ids=[s[2] for s in SURROGATES])
def test_a_lone_surrogate_is_a_400_naming_where(client, endpoint, body, where, index):
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    raw = json.dumps(body).encode()  # JSON escapes it: "\ud800"
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    error = openai_error(response, 400)
    assert error["message"].startswith(f"{where} is not valid Unicode") and f"at index {index}" in error["message"]
    assert error["param"] == where


def test_a_lone_surrogate_as_a_key_is_a_400(client):
    raw = json.dumps({**CHAT, "speculation": {"dr\ud800": 1}}).encode()
    response = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert "a key of speculation is not valid Unicode" in openai_error(response, 400)["message"]


@pytest.mark.parametrize("raw, byte", [(b"\xed\xa0\x80", "0xED"), (b"\xff", "0xFF")])
def test_a_body_that_is_not_utf8_is_a_400_naming_the_byte(client, raw, byte):
    start = b'{"max_tokens": 2, "prompt": "caf'
    response = client.post("/v1/completions", content=start + raw + b'"}', headers={"content-type": "application/json"})
    assert f"not valid UTF-8: the byte {byte} at offset {len(start)}" in openai_error(response, 400)["message"]


def test_check_unicode_names_what_and_where_and_passes_valid_text():
    check_unicode("café ☕ 𝄞", "prompt")  # a character beyond the BMP is one code point, not a surrogate
    with pytest.raises(RequestError, match=r"a --stop string is not valid Unicode: a lone surrogate U\+DCE9 at index 3") as caught:
        check_unicode("caf\udce9", "a --stop string")
    assert caught.value.param == "a --stop string"
    with pytest.raises(RequestError, match="prompt is not valid Unicode"):
        check_text("ok \ud800")


def test_the_library_names_the_position_not_the_tokenizers_type_error(tiny_model):
    from specdraft import LLM
    from tests.helpers.tiny import loaded

    llm = LLM(loaded(tiny_model), drafters=["none"], max_batch=1, calibrate=False)
    with pytest.raises(RequestError, match="prompt is not valid Unicode: a lone surrogate U\\+D800 at index 4"):
        llm.generate("abcd\ud800")
    with pytest.raises(RequestError, match="prompt 1: prompt is not valid Unicode"):
        llm.generate(["fine", "\udc80"])
    with pytest.raises(RequestError, match="message 1's content is not valid Unicode: .* at index 1"):
        llm.chat([{"role": "system", "content": "ok"}, {"role": "user", "content": "x\ud800"}])


# -- the API key ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(runtime):
    with client_for(runtime, Access(api_key=KEY)) as client:
        yield client


@pytest.mark.parametrize("method, path", [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/docs"),
                                          ("GET", "/openapi.json"), ("GET", "/"), ("POST", "/v1/completions"),
                                          ("POST", "/v1/chat/completions"), ("GET", "/v1/nothing")])
def test_every_route_but_health_needs_the_key(keyed, method, path):
    response = keyed.request(method, path, json=COMPLETION if method == "POST" else None)
    error = openai_error(response, 401)
    assert "no API key given" in error["message"] and error["code"] is None
    # the playground's page asks a browser for the key (Basic: its user types it as the password)
    assert response.headers["www-authenticate"] == ('Basic realm="specdraft", charset="UTF-8"' if path == "/" else "Bearer")


def test_health_needs_no_key(keyed):
    assert keyed.get("/health").status_code == 200


@pytest.mark.parametrize("header", [f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", f"Basic {KEY}", KEY, "Bearer "])
def test_a_wrong_key_is_a_401_invalid_api_key(keyed, header):
    error = openai_error(keyed.get("/v1/models", headers={"authorization": header}), 401)
    assert error["code"] == "invalid_api_key" and KEY not in error["message"]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_browser_sends_the_key_as_basic_credentials_for_the_page_and_its_requests(keyed):
    header = {"authorization": basic("anyone", KEY)}
    page = keyed.get("/", headers=header)
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert keyed.get("/v1/models", headers=header).status_code == 200
    assert keyed.post("/v1/completions", json=COMPLETION, headers=header).status_code == 200
    for wrong in (basic("anyone", KEY + "x"), basic(KEY, ""), "Basic !!notbase64", basic("", KEY)[:-2]):
        error = openai_error(keyed.get("/", headers={"authorization": wrong}), 401)
        assert error["code"] == "invalid_api_key"


def test_the_right_key_is_served(keyed):
    assert keyed.get("/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert keyed.get("/metrics", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    response = keyed.post("/v1/completions", json=COMPLETION, headers={"authorization": f"Bearer {KEY}"})
    assert response.status_code == 200, response.text


def test_the_key_comes_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv("SPECDRAFT_API_KEY", "from-env")
    assert access_for("127.0.0.1").api_key == "from-env"
    assert access_for("127.0.0.1", api_key="given").api_key == "given"
    monkeypatch.setenv("SPECDRAFT_API_KEY", "")
    assert access_for("127.0.0.1").api_key is None
    with pytest.raises(ValueError, match="non-empty"):
        access_for("127.0.0.1", api_key="")


@pytest.mark.parametrize("host, key, warned", [("0.0.0.0", None, True), ("::", None, True), ("192.168.1.5", None, True),
                                               ("0.0.0.0", KEY, False), ("127.0.0.1", None, False),
                                               ("localhost", None, False), ("::1", None, False)])
def test_serving_beyond_loopback_without_a_key_is_warned_about(monkeypatch, caplog, host, key, warned):
    monkeypatch.delenv("SPECDRAFT_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="specdraft.server"):
        access_for(host, api_key=key)
    assert ("without an API key" in caplog.text) is warned


# -- the Host header ------------------------------------------------------------------------------
@pytest.mark.parametrize("host, allowed, served", [
    ("localhost:8000", (), True), ("127.0.0.1:8000", (), True), ("[::1]:8000", (), True), ("LOCALHOST.", (), True),
    ("10.1.2.3:8000", (), True),  # an IP address: a rebinding page sends its own name, never an address
    ("evil.example:8000", (), False), ("localhost.evil.example", (), False),
    ("models.internal:8000", ("models.internal",), True), ("evil.example", ("*",), True),
])
def test_the_host_header_must_be_one_this_server_answers_for(runtime, host, allowed, served):
    with client_for(runtime, access_for("127.0.0.1", allowed_hosts=allowed)) as client:
        response = client.get("/v1/models", headers={"host": host})
    if served:
        assert response.status_code == 200, response.text
    else:
        error = openai_error(response, 421)
        assert "does not answer for the host" in error["message"] and "--allowed-hosts" in error["message"]


def test_the_bound_host_name_is_answered_for(runtime):
    with client_for(runtime, access_for("myserver.lan:9000")) as client:
        assert client.get("/v1/models", headers={"host": "myserver.lan:9000"}).status_code == 200
        assert client.get("/v1/models", headers={"host": "other.lan"}).status_code == 421


# -- the content type -----------------------------------------------------------------------------
@pytest.mark.parametrize("content_type, got", [("text/plain", "got 'text/plain'"),
                                               ("application/x-www-form-urlencoded", "got 'application/x-www-form-urlencoded'"),
                                               (None, "no Content-Type was sent")])
def test_a_body_that_is_not_json_is_a_415_saying_so(client, content_type, got):
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                           headers=headers)
    error = openai_error(response, 415)
    assert "Content-Type: application/json" in error["message"] and got in error["message"]
    assert "valid dictionary" not in error["message"]


def test_json_with_a_charset_is_served(client):
    response = client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                           headers={"content-type": "application/json; charset=utf-8"})
    assert response.status_code == 200, response.text


# -- the context, on characters -------------------------------------------------------------------
def test_a_prompt_too_long_by_its_characters_is_refused_without_tokenizing(client, runtime, monkeypatch):
    def never(*_):
        raise AssertionError("tokenized")

    monkeypatch.setattr(server_module, "_encode", never)
    per_token = characters_per_token(runtime.target.tokenizer)
    prompt = "a" * (CONTEXT * per_token + 1)
    with client_for(runtime) as big:
        response = big.post("/v1/completions", json={**COMPLETION, "prompt": prompt})
    error = openai_error(response, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert f"has {len(prompt)} characters" in error["message"] and f"context is {CONTEXT} tokens" in error["message"]


def test_a_prompt_within_the_characters_bound_is_tokenized_and_checked_by_tokens(client, runtime):
    per_token = characters_per_token(runtime.target.tokenizer)
    prompt = "x " * 400  # 800 characters: under the bound, over the context in tokens
    assert len(prompt) <= CONTEXT * per_token
    error = openai_error(client.post("/v1/completions", json={**COMPLETION, "prompt": prompt}), 400)
    assert error["code"] == "context_length_exceeded" and "the prompt has" in error["message"] and "tokens" in error["message"]


def test_the_characters_bound_is_never_above_the_tokens(tokenizer):
    """Property: no text is fewer tokens than its characters over the bound, whatever it repeats."""
    per_token = characters_per_token(tokenizer)
    assert per_token is not None and per_token >= 1
    rng = random.Random(0)
    pieces = [" ", "\n", "    ", "the", " the", "=", "-", "é", "日本", "🙂", "<|im_start|>", "0123456789", "a"]
    texts = [piece * 3000 for piece in pieces]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 2000))) for _ in range(40)]
    for text in texts:
        assert len(tokenizer(text).input_ids) * per_token >= len(text), text[:40]


def test_a_tokenizer_that_normalizes_gets_no_characters_bound(tokenizer):
    from tokenizers import normalizers

    assert characters_per_token(object()) is None
    normalizing = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
    normalizing.normalizer = normalizers.NFC()

    class Normalizing:
        backend_tokenizer = normalizing
        get_vocab = tokenizer.get_vocab

    assert characters_per_token(Normalizing()) is None


# -- a schema that is only itself -----------------------------------------------------------------
@pytest.mark.parametrize("schema, cycle", [
    ({"$ref": "#"}, "# -> #"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
     "#/$defs/a -> #/$defs/b -> #/$defs/a"),
    ({"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/properties/x"}]}}},
     "#/properties/x -> #/properties/x/allOf/0 -> #/properties/x"),
])
def test_a_schema_that_refers_only_to_itself_is_a_400_naming_the_cycle(client, schema, cycle):
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    error = openai_error(client.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "response_format" and cycle in error["message"], error


def test_a_recursive_schema_through_a_property_is_served(client):
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 0}},
            "required": ["kids"], "additionalProperties": False}
    body = {**CHAT, "max_tokens": 12, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].startswith('{"kids": [')


# -- the flags, through `specdraft serve` ---------------------------------------------------------
@pytest.mark.subprocess
def test_serve_takes_the_key_from_the_environment_and_the_limit_and_hosts_from_its_flags(tiny_dir, monkeypatch):
    from benchmarks.common import live_server

    monkeypatch.setenv("SPECDRAFT_API_KEY", KEY)
    with live_server("--model", str(tiny_dir), "--max-model-len", str(CONTEXT), "--drafters", "none",
                     "--max-body-bytes", "3000", "--allowed-hosts", "models.internal") as url:
        auth = {"authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={**auth, "host": "models.internal"}).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={**auth, "host": "evil.example"}).status_code == 421
        big = httpx.post(f"{url}/v1/completions", json={**COMPLETION, "prompt": "x" * 4000}, headers=auth)
        assert big.status_code == 413 and "at most 3000" in big.json()["error"]["message"]
