#!/usr/bin/env bash
# Set up (if needed) and run the main job: the OpenAI-compatible server on the embedded
# SmolLM2-135M-Instruct with the ngram drafter, on http://127.0.0.1:8000 (extra args go to
# `specdraft serve`, e.g. --port 9000 or --drafter hybrid). Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TRANSFORMERS_VERBOSITY=error
exec specdraft serve --drafter ngram "$@"
