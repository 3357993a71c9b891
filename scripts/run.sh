#!/usr/bin/env bash
# Set up (if needed) and run the main job on the embedded model: a code-rewrite prompt, plain
# decoding and then the ngram drafter, with their speeds side by side. Extra args go to both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TRANSFORMERS_VERBOSITY=error
PROMPT='Rewrite this function with type hints and a docstring, keeping the logic the same:

def moving_average(values, window):
    result = []
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        result.append(sum(chunk) / window)
    return result'
for drafter in none ngram; do
    echo "== specdraft generate --drafter $drafter =="
    specdraft generate "$PROMPT" --drafter "$drafter" --max-tokens 160 "$@"
done
