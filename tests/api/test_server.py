"""The server on the embedded model, through the official `openai` client and raw HTTP: its greedy
text is the library's; completions and chat, streamed and not; streamed text equals the whole; usage
is exact; stop strings; a seed reproduces a sample; per-request speculation switches drafter; the SSE
framing; disconnects free rows."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from openai import OpenAI

from specdraft.runtime import encode_prompt
from benchmarks.common import live_server

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
CODE = "Rewrite this function with type hints:\n\ndef add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server("--max-batch-size", "4", "--max-queue", "8", "--device", "cpu", "--dtype", "float32",
                     log=tmp_path_factory.mktemp("server") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client):
    [only] = client.models.list().data
    return only.id


def test_the_server_decodes_as_the_library_does_on_the_main_thread(client, model, embedded_int8):
    """The server steps on a thread of its own, in the int8 arithmetic by default: its greedy text is
    the library's, computed here on the main thread (once it was not: a projection freed its
    quantised tokens before its threads read them, and off the main thread the memory was reused)."""
    from specdraft import LLM, SamplingParams

    ids = encode_prompt(embedded_int8.tokenizer, "def fib(n):", chat=False)
    library = LLM(embedded_int8, drafters=["none"], max_batch=1, calibrate=False)
    [want] = library.generate(ids, SamplingParams(max_tokens=24))
    served = client.completions.create(model=model, prompt="def fib(n):", max_tokens=24, temperature=0,
                                       extra_body={"speculation": {"drafter": "none"}})
    assert served.choices[0].text == want.text


def test_models_lists_the_served_model(client, model):
    assert model == "SmolLM2-135M-Instruct"


def test_completion_streamed_equals_whole_and_usage_is_exact(client, model, embedded):
    whole = client.completions.create(model=model, prompt="def fib(n):", max_tokens=40, temperature=0)
    pieces, usage, finishes = [], None, []
    for chunk in client.completions.create(model=model, prompt="def fib(n):", max_tokens=40, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finishes.append(chunk.choices[0].finish_reason)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == whole.choices[0].text
    assert [f for f in finishes if f] == [whole.choices[0].finish_reason]  # exactly one chunk finishes
    prompt_tokens = len(encode_prompt(embedded.tokenizer, "def fib(n):", chat=False))
    assert whole.usage.prompt_tokens == usage.prompt_tokens == prompt_tokens
    assert whole.usage.completion_tokens == usage.completion_tokens
    assert whole.usage.total_tokens == prompt_tokens + whole.usage.completion_tokens
    if whole.choices[0].finish_reason == "length":
        assert whole.usage.completion_tokens == 40
    stats = whole.usage.model_extra["speculation"]
    assert stats["drafter"] == "ngram" and stats["steps"] >= 1


def test_chat_streamed_equals_whole(client, model):
    messages = [{"role": "user", "content": CODE}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_every_drafter_gives_the_same_greedy_text(client, model):
    texts = {}
    for drafter in ("none", "ngram", "model", "hybrid"):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": CODE}], max_tokens=48,
                                               temperature=0, extra_body={"speculation": {"drafter": drafter}})
        texts[drafter] = reply.choices[0].message.content
        assert reply.usage.model_extra["speculation"]["drafter"] == drafter
    assert len(set(texts.values())) == 1, texts


def test_stop_string_ends_the_text(client, model):
    whole = client.completions.create(model=model, prompt="def fib(n):", max_tokens=40, temperature=0).choices[0].text
    stop = whole[10:13]
    cut = client.completions.create(model=model, prompt="def fib(n):", max_tokens=40, temperature=0, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == whole[: whole.index(stop)]


def test_seed_reproduces_a_sampled_completion(client, model):
    def sample(seed):
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a story."}],
                                              max_tokens=32, temperature=0.9, top_p=0.95, seed=seed).choices[0].message.content

    first = sample(11)
    assert sample(11) == first
    assert sample(12) != first


def test_raw_sse_framing(server, model):
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = "".join(response.iter_text())
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2] if not e.startswith(":")]
    assert all(e.startswith("data: ") for e in events[:-1] if not e.startswith(":"))
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert len({p["id"] for p in payloads}) == 1
    assert sum(1 for p in payloads if p["choices"][0]["finish_reason"]) == 1


def test_annotate_marks_the_accepted_draft_text_of_each_chunk(client, model):
    prompt = "Repeat exactly: alpha, beta, gamma, delta, epsilon, alpha, beta, gamma, delta, epsilon,"
    plain = list(client.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0, stream=True))
    assert all("speculation" not in (c.choices[0].model_extra or {}) for c in plain)  # off unless asked for
    chunks = [c.choices[0] for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=32, temperature=0, stream=True,
        extra_body={"speculation": {"drafter": "ngram", "policy": "fixed", "annotate": True}}) if c.choices and c.choices[0].text]
    drafted = [c.model_extra["speculation"]["drafted_text"] for c in chunks]
    # Each step's text is its accepted draft tokens then the target's own token, so the drafted part is a prefix.
    assert all(c.text.startswith(d) for c, d in zip(chunks, drafted))
    assert sum(map(len, drafted)) > 0, "no accepted draft text on a copy-heavy prompt"
    assert "".join(c.text for c in chunks) == "".join(c.choices[0].text for c in plain)


def test_client_that_disconnects_is_cancelled(server, model):
    body = {"model": model, "prompt": "Count to a thousand: 1, 2, 3,", "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    deadline = time.monotonic() + 20
    while httpx.get(f"{server}/health").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "model": model, "running": 0, "waiting": 0}
    assert 'specdraft_requests_total{outcome="cancelled"}' in httpx.get(f"{server}/metrics").text


def test_metrics_report_tokens_and_acceptance(server):
    text = httpx.get(f"{server}/metrics").text
    for name in ("specdraft_generated_tokens_total", "specdraft_draft_tokens_total", "specdraft_accepted_tokens_total",
                 "specdraft_position_drafted_total", "specdraft_step_seconds_bucket", "specdraft_queue_depth",
                 "specdraft_running_rows", "specdraft_time_to_first_token_seconds_bucket",
                 'specdraft_prompt_tokens_total{source="cached"}', 'specdraft_prompt_tokens_total{source="computed"}',
                 "specdraft_prefix_cache_bytes", "specdraft_prefix_cache_evictions"):
        assert name in text, name


def test_a_conversation_reuses_its_history_within_its_salt_only(server, client, model):
    """Each turn twice: under the conversation's salt (a hit on the history) and under a fresh one (cold):
    the same reply, cached_tokens 0 cold and most of the prompt warm, streamed or not."""
    messages = [{"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
                {"role": "user", "content": "Name a prime number above ten."}]
    for turn in range(3):
        def ask(salt, stream):
            body = dict(model=model, messages=messages, max_tokens=24, temperature=0, extra_body={"cache_salt": salt})
            if not stream:
                reply = client.chat.completions.create(**body)
                return reply.choices[0].message.content, reply.usage
            chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage

        warm_text, warm = ask("conversation", stream=turn == 2)
        cold_text, cold = ask(f"fresh-{turn}", stream=turn == 1)
        assert warm_text == cold_text
        assert cold.prompt_tokens_details.cached_tokens == 0
        if turn:
            assert warm.prompt_tokens_details.cached_tokens >= 0.7 * warm.prompt_tokens, (turn, warm)
        messages += [{"role": "assistant", "content": warm_text}, {"role": "user", "content": "And another one?"}]
    text = httpx.get(f"{server}/metrics").text
    cached = next(line for line in text.splitlines() if line.startswith('specdraft_prompt_tokens_total{source="cached"}'))
    assert float(cached.split()[-1]) > 0


def test_a_bad_cache_salt_is_a_400_naming_it(server, model):
    reply = httpx.post(f"{server}/v1/completions", json={"model": model, "prompt": "hi", "cache_salt": ""})
    assert reply.status_code == 400 and "cache_salt" in reply.json()["error"]["message"]


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_response_format_json_schema_streamed_equals_whole_and_validates(client, model, endpoint):
    import jsonschema

    question = "It is 21 C in Lisbon today. Give the city and the temperature as JSON."
    if endpoint == "chat":
        call = lambda **kw: client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                          max_tokens=40, temperature=0, response_format=SCHEMA_FORMAT, **kw)
        piece = lambda choice: choice.delta.content or ""
        whole_text = lambda choice: choice.message.content
    else:
        call = lambda **kw: client.completions.create(model=model, prompt=question + "\n", max_tokens=40, temperature=0,
                                                     extra_body={"response_format": SCHEMA_FORMAT}, **kw)
        piece = lambda choice: choice.text
        whole_text = lambda choice: choice.text
    whole = call()
    pieces, last = [], None
    for chunk in call(stream=True):
        if chunk.choices:
            pieces.append(piece(chunk.choices[0]))
            if chunk.choices[0].finish_reason:
                last = chunk.choices[0]
    text = whole_text(whole.choices[0])
    assert "".join(pieces) == text
    assert whole.choices[0].finish_reason == last.finish_reason == "stop"
    jsonschema.validate(json.loads(text), WEATHER)
    assert whole.choices[0].model_extra["structured_output"] == last.model_extra["structured_output"] == {"complete": True}


def test_a_budget_ending_mid_object_says_so(client, model):
    whole = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe Lisbon as JSON."}],
                                           max_tokens=5, temperature=0, response_format={"type": "json_object"})
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and choice.message.content.startswith("{")
    assert choice.model_extra["structured_output"]["complete"] is False
    assert "max_tokens ran out before the JSON was complete" in choice.model_extra["structured_output"]["message"]
