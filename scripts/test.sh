#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_browser.sh
. .venv/bin/activate
export TRANSFORMERS_VERBOSITY=error
python -m pytest -q -p no:cacheprovider "$@"
# The vLLM integration tests (tests/vllm) run in their own environment, .venv-vllm, on a full run only.
if [ $# -eq 0 ]; then
    bash scripts/setup_vllm.sh
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm
fi
