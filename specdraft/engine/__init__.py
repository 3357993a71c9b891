"""The request loop between the API and the verifier. Start reading at `intake.py` (a request checked
once and resolved) and `engine.py` (`Engine`: submit, cancel, the loop that admits, steps and
prefills on one token budget, emitting and retiring); a decode step's stages are
in `step.py` (they return what happened; the loop applies it), structured output's part in
`constrain.py`, the start-up measurements in `calibrate.py`, and what a request is and reports in
`requests.py` (`Request`, `RequestMetrics`, `Delta`, `Completion`)."""

from specdraft.engine.engine import Engine
from specdraft.engine.requests import ResolvedRequest
from specdraft.engine.requests import Completion, Delta, EngineStats, GrammarMetrics, Request, RequestMetrics
from specdraft.errors import RequestError

__all__ = ["Completion", "Delta", "Engine", "EngineStats", "GrammarMetrics", "Request", "RequestError", "RequestMetrics",
           "ResolvedRequest"]
