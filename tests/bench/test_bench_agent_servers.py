"""The servers' agent benchmark: llama-server's commands, one streamed turn read back from a server
that streams as llama-server does (its `timings`: cached prompt tokens, drafts) and from
`specdraft serve` (its usage's speculation figures), and the summary held to the runs it summarises."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.serving import agent_servers
from tests.helpers.tiny_dir import tiny_model_dir

CHUNKS = [{"choices": [{"delta": {"role": "assistant"}}]},
          {"choices": [{"delta": {"content": "[]"}}]},
          {"choices": [{"delta": {"content": " ok"}}]},
          {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 40},
           "timings": {"cache_n": 30, "draft_n": 4, "draft_n_accepted": 3}}]


class LlamaServerLike(BaseHTTPRequestHandler):
    """Streams `CHUNKS` as llama-server's chat endpoint does (usage without cached tokens; timings)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] and body["temperature"] == 0 and body["max_tokens"] == 8
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in CHUNKS:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_a_llama_server_turn_reads_its_timings():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LlamaServerLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = agent_servers.turn(f"http://127.0.0.1:{server.server_port}", [{"role": "user", "content": "hi"}], 8, {})
    finally:
        server.shutdown()
    assert run["text"] == "[] ok" and run["tokens"] == 3 and run["prompt_tokens"] == 40
    assert (run["cached_tokens"], run["draft_tokens"], run["accepted_tokens"]) == (30, 4, 3)
    assert 0 < run["time_to_first_token"] <= run["seconds"] and run["tokens_per_second"] > 0


@pytest.mark.slow
def test_a_specdraft_turn_reads_its_usage(tmp_path):
    import httpx

    from benchmarks.common import live_server

    folder = tiny_model_dir(tmp_path / "tiny")
    with live_server("--model", str(folder), "--max-model-len", "256", "--drafters", "none,ngram") as url:
        messages = [{"role": "user", "content": "say a a a a a a a a"}]
        served = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        runs = [agent_servers.turn(url, messages, 8, {"model": served, "speculation": {"drafter": name}, "cache_salt": name})
                for name in ("none", "ngram", "ngram")]
    assert runs[0]["text"] == runs[1]["text"] == runs[2]["text"] and runs[0]["tokens"] == 8
    assert runs[0]["draft_tokens"] == 0 and runs[0]["cached_tokens"] == 0
    assert runs[2]["cached_tokens"] > 0  # the same prompt again, under the same salt


def test_llama_servers_commands_and_a_missing_binary(tmp_path):
    with pytest.raises(FileNotFoundError, match="llama-server not found"):
        agent_servers.llama_server_methods(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 5)
    (tmp_path / "llama-server").write_text("")
    methods = agent_servers.llama_server_methods(tmp_path, tmp_path / "t.gguf", tmp_path / "d.gguf", 5)
    plain, drafting = methods["llama-server"], methods["llama-server -md k5"]
    assert "-md" not in plain and "--cache-prompt" in plain
    assert drafting[drafting.index("-md") + 1].endswith("d.gguf") and drafting[drafting.index("--spec-draft-n-max") + 1] == "5"


def run(tps: float, first: float, cached: int = 0, drafted: int = 0, accepted: int = 0) -> dict:
    return {"tokens_per_second": tps, "time_to_first_token": first, "decode_tokens_per_second": 2 * tps,
            "cached_tokens": cached, "prompt_tokens": 100, "draft_tokens": drafted, "accepted_tokens": accepted}


def test_the_summary_is_medians_of_the_turns_and_ratios_to_none():
    turns = [{"turn": i, "runs": {"none": run(10.0, 1.0), "hybrid": run(15.0 + i, 1.0, 50, 10, 8),
                                  "llama-server": run(8.0, 2.0, 90)},
              "equal": {"none": True, "hybrid": True, "llama-server": True}} for i in range(3)]
    summary = agent_servers.summarize(turns)
    assert summary["all"]["turns"] == 3 and summary["3+"]["turns"] == 1
    hybrid = summary["all"]["cells"]["hybrid"]
    assert hybrid["tokens_per_second"] == 16.0 and hybrid["speedup"] == 1.6 and hybrid["cached_share"] == 0.5
    assert hybrid["accepted_per_drafted"] == 0.8 and summary["all"]["cells"]["none"]["accepted_per_drafted"] is None
    assert summary["all"]["cells"]["llama-server"]["speedup"] == 0.8
    text = agent_servers.render({"machine": "m", "target": "t", "draft": "d", "threads": 2, "max_tokens": 8, "k": 5,
                                 "conversations": 1, "summary": summary})
    assert "| all | 3 | hybrid | 100 | 1.00 | 32.0 | 16.0 | 1.60x | 50% | 0.80 | 3/3 |" in text


def test_a_reply_is_held_to_its_own_servers_plain_decoding():
    replies = {"none": ["a"], "hybrid": ["a"], "llama-server": ["b"], "llama-server -md k5": ["c"]}
    assert agent_servers.same_history(replies, "hybrid") and agent_servers.same_history(replies, "llama-server")
    assert not agent_servers.same_history(replies, "llama-server -md k5")
