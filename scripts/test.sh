#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_browser.sh
. .venv/bin/activate
export TRANSFORMERS_VERBOSITY=error
checkout() { git status --porcelain 2>/dev/null || true; }
before="$(checkout)"
python -m pytest -q -p no:cacheprovider "$@"
# On a full run only: the checks of a token's arithmetic again as an AVX2-only CPU (a Zen 3) computes
# it, the compiled kernel's AVX2 build and the libraries held to AVX2 (`specdraft.threads`); then the
# vLLM integration tests (tests/vllm) in their own environment, .venv-vllm; then the checkout must be
# as the suite found it.
if [ $# -eq 0 ]; then
    SPECDRAFT_KERNEL_PATH=avx2 python -m pytest -q -p no:cacheprovider tests/backend/test_row_counts.py \
        tests/backend/test_invariance.py tests/backend/test_block_kinds.py tests/backend/test_cpu_invariance.py
    bash scripts/setup_vllm.sh
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm
    if [ "$(checkout)" != "$before" ]; then
        echo "the test suite changed the checkout (git status before, then after):" >&2
        echo "$before" >&2
        checkout >&2
        exit 1
    fi
fi
