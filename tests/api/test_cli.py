"""CLI edges: bad input gives one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.subprocess


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
        (["generate", "hi", "--temperature", "-1"], "--temperature must be between 0 and 2, got -1"),
        (["generate", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["generate", "hi", "--drafter", "ngram", "--draft-model", "x"], "a draft model is used by the model and hybrid drafters"),
        (["serve", "--port", "99999"], "--port must be between 0 and 65535, got 99999"),
        (["serve", "--port", "http"], "--port must be an integer, got 'http'"),
        (["serve", "--max-queue", "-1"], "--max-queue must be >= 0, got -1"),
        (["serve", "--max-batch-size", "0"], "--max-batch-size must be >= 1, got 0"),
        (["serve", "--drafters", "ngram,magic"], "unknown drafter 'magic'"),
        (["serve", "--drafters", "none", "--drafter", "none", "--ngram-memory"],
         "--ngram-memory needs the ngram or hybrid drafter among --drafters"),
        (["generate", "hi", "--policy", "greedy"], "argument --policy: invalid choice: 'greedy'"),
        (["serve", "--policy", "always"], "argument --policy: invalid choice: 'always'"),
        (["generate", "hi", "--drafter-options", "{max_n: 4}"], "--drafter-options: must be a JSON object, got '{max_n: 4}'"),
        (["generate", "hi", "--drafter-options", "[4]"], "--drafter-options: must be a JSON object of drafter names to options"),
        (["generate", "hi", "--drafter-options", '{"ngram": 4}'], "the options of 'ngram' must be a JSON object, got 4"),
        (["generate", "hi", "--drafter-options", '{"magic": {}}'], "--drafter-options: unknown drafter 'magic'"),
        (["serve", "--drafter-options", '{"ngram": {"max_ngram": 3}}'], "drafter 'ngram' has no option 'max_ngram'; its options: "),
        (["generate", "hi", "--drafter", "none", "--drafter-options", '{"ngram": {"max_n": 3}}'],
         "drafter options name 'ngram', which is not among the drafters: none"),
        (["serve", "--model", "/no/such/model.gguf"], "model file not found: /no/such/model.gguf"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message):
    proc = run_cli(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr
