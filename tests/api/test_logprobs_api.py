"""Logprobs through the OpenAI-compatible server (a tiny model, the official `openai` client): chat's
`logprobs` / `top_logprobs` and the legacy endpoint's `logprobs`, in OpenAI's shapes, streamed (each
chunk its own tokens' entries) and not; a speculative request's equal a plain one's. The refusals are
in test_server_edges.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from openai import OpenAI

from benchmarks.common import live_server
from tests.helpers.tiny_dir import tiny_model_dir

pytestmark = pytest.mark.subprocess

MODEL = "tiny-llama"
SALTS = (f"cold-{i}" for i in itertools.count())  # every request its own: none reuses another's prompt entries
MESSAGES = [{"role": "user", "content": "Count: one two three one two three one two three"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with live_server("--model", str(tiny_model_dir(tmp_path_factory.mktemp(MODEL))), "--served-model-name", MODEL,
                     "--max-model-len", "256", "--max-batch-size", "2", "--drafters", "none,ngram") as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def extra(drafter: str) -> dict:
    return {"speculation": {"drafter": drafter, "policy": "fixed"}, "cache_salt": next(SALTS)}


def chat(client, stream: bool = False, drafter: str = "none", **options):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=stream,
                                          extra_body=extra(drafter), **options)


def completion(client, stream: bool = False, drafter: str = "none", **options):
    return client.completions.create(model=MODEL, prompt="one two three one two three one two", max_tokens=12,
                                     temperature=0, stream=stream, extra_body=extra(drafter), **options)


def entries(content) -> list[tuple]:
    return [(e.token, e.logprob, e.bytes, [(t.token, t.logprob, t.bytes) for t in e.top_logprobs]) for e in content]


def test_chat_logprobs_in_openais_shape_streamed_and_not(client):
    whole = chat(client, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)  # greedy
    chunks = [c for c in chat(client, stream=True, logprobs=True, top_logprobs=3) if c.choices]
    streamed = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert entries(streamed) == entries(content)
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices[0].finish_reason or c.choices[0].delta.role)


def test_chat_logprobs_without_top_logprobs_and_none_asked(client):
    content = chat(client, logprobs=True).choices[0].logprobs.content
    assert content and all(e.top_logprobs == [] for e in content)
    assert chat(client).choices[0].logprobs is None
    assert all(c.choices[0].logprobs is None for c in chat(client, stream=True) if c.choices)


def test_completion_logprobs_in_openais_shape_streamed_and_not(client):
    whole = completion(client, logprobs=2)
    logprobs = whole.choices[0].logprobs
    n = whole.usage.completion_tokens
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == n
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 and top[token] == lp  # greedy: the token is the most likely
               for token, lp, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs))
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(n)]
    chunks = list(completion(client, stream=True, logprobs=2))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert len(parts) > 1  # each chunk carries its own tokens' entries
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for part in parts for x in getattr(part, field)] == getattr(logprobs, field), field


def texts_and_values(choice) -> tuple[list, list]:
    """Each token's text and its top tokens' texts, and their logprobs, from either endpoint's choice."""
    logprobs = choice.logprobs
    if hasattr(logprobs, "content"):  # chat
        return ([[e.token, *(t.token for t in e.top_logprobs)] for e in logprobs.content],
                [[e.logprob, *(t.logprob for t in e.top_logprobs)] for e in logprobs.content])
    return ([[token, *top] for token, top in zip(logprobs.tokens, logprobs.top_logprobs)],
            [[lp, *top.values()] for lp, top in zip(logprobs.token_logprobs, logprobs.top_logprobs)])


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_a_speculative_requests_logprobs_equal_a_plain_ones(client, endpoint):
    """The same tokens, top tokens and values; values to float32 rounding only: this model's CPU
    kernels round a verify pass's logits otherwise than a plain step's in places (batch-invariant
    kernels give them bit for bit: tests/verifier/test_logprobs_invariance.py)."""
    if endpoint == "chat":
        plain, ngram = (chat(client, drafter=d, logprobs=True, top_logprobs=2) for d in ("none", "ngram"))
    else:
        plain, ngram = (completion(client, drafter=d, logprobs=2) for d in ("none", "ngram"))
        assert ngram.choices[0].logprobs.text_offset == plain.choices[0].logprobs.text_offset
    assert ngram.usage.model_extra["speculation"]["accepted_tokens"] > 0
    (got_texts, got_values), (texts, values) = texts_and_values(ngram.choices[0]), texts_and_values(plain.choices[0])
    assert got_texts == texts
    assert np.allclose(got_values, values, rtol=0, atol=1e-5)
