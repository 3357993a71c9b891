"""Start `specdraft serve` as a real process on a free loopback port, and a tiny model directory to
serve fast (a random 2-layer Llama with the embedded model's tokenizer and chat template)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(*args: str, startup_timeout: float = 300.0, log: Path | None = None):
    """Yield the base URL of a `specdraft serve ARGS` process; stop it (SIGINT: a graceful shutdown) after."""
    port = free_port()
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "specdraft.api.cli", "serve", "--port", str(port), *args],
                            stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    try:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else (log.read_text() if log else "")
                raise RuntimeError(f"specdraft serve exited with {proc.returncode}: {err[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("specdraft serve did not come up in time")
            time.sleep(0.3)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if log:
            out.close()


def tiny_model_dir(path: Path) -> Path:
    """A random 2-layer Llama at the embedded model's vocabulary, with its tokenizer: served in
    milliseconds per token, for tests that exercise the API rather than the model."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from specdraft.models import convert_gguf, embedded_gguf

    source = convert_gguf(embedded_gguf())
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
