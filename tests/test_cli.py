"""CLI edges: bad input gives one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(*args, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, "-m", "specdraft.api.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", ""], "prompt is empty"),
        (["generate", "   "], "prompt is empty"),
        (["generate", "hi", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
        (["generate", "hi", "--max-tokens", "-3"], "--max-tokens must be >= 1, got -3"),
        (["generate", "hi", "--max-tokens", "many"], "--max-tokens must be an integer, got 'many'"),
        (["generate", "hi", "--drafter", "magic"], "invalid choice: 'magic'"),
        (["generate", "hi", "--model", "/no/such/model.gguf"], "model file not found: /no/such/model.gguf"),
        (["generate", "hi", "--model", "./no-such-dir"], "model path not found: ./no-such-dir"),
        (["generate", "hi", "--model", "nobody/no-such-model"], "no hub download attempted"),
        (["generate", "hi", "--temperature", "-1"], "temperature must be between 0 and 100"),
        (["generate", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message):
    proc = run_cli(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
