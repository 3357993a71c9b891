"""Helpers the tests share: what more than one test module builds or calls, one module a job (a tiny
model directory to serve, GGUF files written in-process, a tiny Qwen2, the kernel's builds, a row's
logits pass by pass, fixed prompts, the `ngram` drafter's naive references, a catalogue entry and its
fake installer, the CLI as a subprocess, a fake vLLM config). A test module takes helpers from here and
fixtures from a conftest.py, never anything from another test module (`tests/house/test_test_imports.py`)."""
