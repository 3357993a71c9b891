"""specdraft: lossless speculative decoding with pluggable drafters.

    from specdraft import LLM, SamplingParams, SpeculationParams
    llm = LLM()
    outs = llm.generate(["prompt a", "prompt b"], SamplingParams(max_tokens=64), SpeculationParams("ngram"))

`LLM`, `RequestOutput` (`specdraft.llm`: the engine's `Completion`) and `TokenLogprob` (`specdraft.verifier`)
load torch and are imported on first use, so that importing the package (the CLI does) stays light;
`Settings` (`specdraft.settings`: how an engine is built, `LLM(model, settings)`) does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from specdraft import threads

# OpenMP's and numba's thread settings: read once, as torch and numba load, so they are set here, before
# any specdraft module imports either (the one place: see `specdraft.threads`).
threads.configure()

from specdraft.drafters import Draft, Drafter, register  # noqa: E402
from specdraft.params import ResponseFormat, SamplingParams, SpeculationParams  # noqa: E402
from specdraft.settings import Settings  # noqa: E402

if TYPE_CHECKING:
    from specdraft.llm import LLM, RequestOutput
    from specdraft.results import TokenLogprob

__version__ = "0.1.0"
__all__ = ["LLM", "Draft", "Drafter", "RequestOutput", "ResponseFormat", "SamplingParams", "Settings",
           "SpeculationParams", "TokenLogprob", "__version__", "register"]
_LAZY = {"LLM": "specdraft.llm", "RequestOutput": "specdraft.llm", "TokenLogprob": "specdraft.results"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'specdraft' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
