"""The many-at-once serving benchmark: llama-server's commands, a batch sent at once read back from a
server that streams as both servers do (aggregate rate, each request's latency and text), a failed
request named, and the summary held to the runs it summarises."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.serving import concurrent_servers as bench


class Streams(BaseHTTPRequestHandler):
    """A chat endpoint that streams the last user message back, two tokens of usage; "fail" is a 400."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        if text == "fail":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "bad"}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in ({"choices": [{"delta": {"content": text}}]},
                      {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 5}}):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Streams)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def bodies(*texts: str) -> list[dict]:
    return [bench.request([{"role": "user", "content": t}], 8, {}) for t in texts]


def test_a_batch_at_once_gives_its_aggregate_and_each_reply(url):
    run = asyncio.run(bench.at_once(url, bodies("a", "b", "c")))
    assert run["tokens"] == 6 and run["texts"] == ["a", "b", "c"]
    assert run["tokens_per_second"] == pytest.approx(6 / run["seconds"])
    assert len(run["latencies"]) == len(run["ttfts"]) == 3
    assert asyncio.run(bench.alone(url, bodies("a", "b")))["texts"] == ["a", "b"]


def test_a_failed_request_fails_the_batch_by_name(url):
    with pytest.raises(RuntimeError, match="1 of 2 requests failed: HTTP 400"):
        asyncio.run(bench.at_once(url, bodies("a", "fail")))


def test_llama_server_has_a_slot_a_request_and_drafts_only_when_asked(tmp_path):
    (tmp_path / "llama-server").write_text("")
    plain = bench.llama_argv(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 8, 0, 0.75)
    assert plain[plain.index("-np") + 1] == "8" and plain[plain.index("-c") + 1] == str(8 * 2048)
    assert "-md" not in plain and "--no-cache-prompt" in plain
    drafted = bench.llama_argv(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 8, 5, 0.75)
    assert drafted[drafted.index("--spec-draft-n-max") + 1] == "5" and drafted[drafted.index("--spec-type") + 1] == "draft-simple"
    with pytest.raises(FileNotFoundError, match="llama-server not found"):
        bench.llama_argv(tmp_path / "nowhere", tmp_path / "t.gguf", tmp_path / "d.gguf", 8, 0, 0.75)


def test_the_summary_is_the_median_over_rounds_against_llama_server_plain():
    def run(round_, method, rate, equal):
        return {"round": round_, "level": 2, "method": method, "tokens_per_second": rate,
                "latencies": [1.0, 3.0], "ttfts": [0.5, 0.7], "equal": equal}
    runs = [run(0, "llama-server", 10.0, 2), run(1, "llama-server", 12.0, 1),
            run(0, "ngram", 22.0, 2), run(1, "ngram", 26.0, 2)]
    ngram = {c["method"]: c for c in bench.summarize(runs, [2], ["ngram", "llama-server"])}["ngram"]
    assert ngram["tokens_per_second"] == 24.0 and ngram["over_llama_server"] == pytest.approx(24.0 / 11.0)
    assert (ngram["latency_median"], ngram["latency_worst"], ngram["ttft_median"]) == (2.0, 3.0, 0.6)
    assert "| 2 | ngram | 24.0 | 2.18x | 22.0, 26.0 |" in bench.render(
        {"machine": "m", "target": "t", "draft": "d", "threads": 2, "max_tokens": 8, "k": 5, "p_min": 0.75,
         "rounds": 2, "alone": {"ours": 1.0, "llama.cpp": 1.0},
         "summary": bench.summarize(runs, [2], ["ngram", "llama-server"])})
