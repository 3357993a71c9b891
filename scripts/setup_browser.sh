#!/usr/bin/env bash
# Idempotent set-up of the browser the playground's test (tests/api/test_playground.py) drives: Debian's
# `chromium` at /usr/bin/chromium, installed with apt when running as root and it is missing. The Python
# package `playwright` comes with the test extras (never `playwright install`: it downloads browsers of
# its own). Without a browser the test skips and says which piece is missing.
set -euo pipefail
CHROMIUM=/usr/bin/chromium
[ -x "$CHROMIUM" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # --reinstall also mends a package whose binary went missing; update only when the lists are stale.
    apt-get install -y -q --reinstall chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q --reinstall chromium >/dev/null; } \
        || true
fi
[ -x "$CHROMIUM" ] || echo "setup_browser: no chromium at $CHROMIUM (apt-get install chromium needs root): the browser test will skip"
