"""splitmix64's finaliser, the one mixing function of the project: it keys random draws
(`specdraft.sampling`) and hashes n-grams (`specdraft.drafters.ngram_table`, `memory`)."""

from __future__ import annotations

import numpy as np
from numba import njit

M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix(x):
    """A bijection on uint64 (a scalar or an array) whose every input bit reaches every output bit;
    its outputs pass BigCrush for counter inputs."""
    x = (x ^ (x >> np.uint64(30))) * M1
    x = (x ^ (x >> np.uint64(27))) * M2
    return x ^ (x >> np.uint64(31))


mix_kernel = njit(cache=True, nogil=True)(mix)  # the same function, for numba kernels
