"""Thread settings (`specdraft.threads`): importing specdraft before torch sets OpenMP's waiting
(a brief spin, then sleep) unless the environment says otherwise; another setting by name; a bad
name warns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdraft.threads import THREAD_VARIABLES

pytestmark = pytest.mark.subprocess


def environment_after_import(**env: str) -> str:
    """OMP_WAIT_POLICY / GOMP_SPINCOUNT / OMP_NUM_THREADS / NUMBA_NUM_THREADS as a fresh process
    sees them after `import specdraft`."""
    clean = {k: v for k, v in os.environ.items() if k not in (*THREAD_VARIABLES, "SPECDRAFT_THREADS")}
    code = ("import os, specdraft; print(*(os.environ.get(k) for k in "
            "('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT', 'OMP_NUM_THREADS', 'NUMBA_NUM_THREADS')))")
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**clean, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip() + ("|warned" if "SPECDRAFT_THREADS" in out.stderr else "")


@pytest.mark.parametrize("env, seen", [
    ({}, "PASSIVE 2000 None None"),                                  # the default: spin briefly, then sleep
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE None None None"),        # the user's own setting stays, whole
    ({"GOMP_SPINCOUNT": "0"}, "None 0 None None"),                   # the same for a spin count
    ({"SPECDRAFT_THREADS": "passive"}, "PASSIVE None None None"),    # sleep at once
    ({"SPECDRAFT_THREADS": "torch"}, "None None None None"),         # torch's defaults
    ({"SPECDRAFT_THREADS": "one-thread"}, "None None 1 1"),          # numba's pool as small as torch's
    ({"OMP_NUM_THREADS": "3"}, "PASSIVE 2000 3 3"),                  # the user's count, numba's too
    ({"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "2"}, "PASSIVE 2000 1 2"),  # numba's own count stays
    ({"SPECDRAFT_THREADS": "many"}, "PASSIVE 2000 None None|warned"),  # not a setting: a warning, the default
])
def test_importing_specdraft_sets_the_thread_environment(env, seen):
    assert environment_after_import(**env) == seen
