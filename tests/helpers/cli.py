"""The CLI as a subprocess (`python -m specdraft.api.cli`), offline, for tests of its edges."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, "-m", "specdraft.api.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)
