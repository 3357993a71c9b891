"""Structured output in the engine, the one engine file that knows the grammar (`specdraft.grammar`):
a request's response format compiled into its `RowGrammar`, each draft of a constrained row cut
before its first token the grammar forbids (an illegal token is never verified) and extended by the
tokens the grammar forces after it, and whether an output is a whole JSON value. The verifier masks
the target's logits with the same grammar and advances it. A grammar that fails while a request
decodes fails that request alone: here its `GrammarError` becomes the failure's message."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specdraft.drafters.base import EMPTY_DRAFT, Draft
from specdraft.errors import RequestError
from specdraft.grammar import GrammarCompiler, GrammarError, RowGrammar
from specdraft.params import SamplingParams

if TYPE_CHECKING:
    from specdraft.engine.requests import Request


def grammar_of(compiler: GrammarCompiler | None, params: SamplingParams, has_eos: bool) -> RowGrammar:
    """The request's grammar state, or RequestError naming why its response format cannot be served."""
    if compiler is None:
        raise RequestError("response_format is not available: this engine was built without a grammar compiler",
                           param="response_format")
    if not has_eos:
        raise RequestError("response_format is not available: this engine has no end-of-sequence token to end "
                           "the JSON with", param="response_format")
    try:
        return compiler.matcher(params.response_format)
    except GrammarError as exc:
        raise RequestError(str(exc), param="response_format") from None


@dataclass(frozen=True)
class Legal:
    """A constrained row's draft made legal: `forced_from`, where the tokens the grammar forced start
    (None: none were added); `error`, why the grammar failed (the row ends)."""

    draft: Draft
    forced_from: int | None = None
    seconds: float = 0.0
    error: str | None = None


def legal(grammar: RowGrammar, draft: Draft, limit: int, forced: bool) -> Legal:
    """`draft` cut before its first token the grammar forbids then, where the drafter allows
    (`Parts.forced_tokens`), extended up to `limit` tokens by the tokens the grammar forces after it.
    Kept tokens lose q: a constrained row's drafts are tested as deterministic (`specdraft.verifier`)."""
    start = time.perf_counter()
    tokens = draft.token_ids.tolist()
    try:
        kept = grammar.legal_prefix(tokens)
        extra = grammar.forced(tokens[:kept], limit - kept) if forced else []
    except GrammarError as exc:
        return Legal(EMPTY_DRAFT, seconds=time.perf_counter() - start, error=str(exc))
    seconds = time.perf_counter() - start
    if kept == len(tokens) and not extra:
        return Legal(draft, seconds=seconds)
    if not kept and not extra:
        return Legal(EMPTY_DRAFT, seconds=seconds)
    cut = Draft(np.asarray(tokens[:kept] + extra, dtype=np.int32), None, draft.kind if kept else "forced")
    return Legal(cut, kept if extra else None, seconds)


def forced_tally(forced_from: int | None, drafted: int, accepted: int) -> tuple[int, int]:
    """The forced tokens a step verified where the draft before them was accepted, and how many of
    those were accepted: (0, 0) where none were reached."""
    begin = drafted if forced_from is None else forced_from
    if accepted < begin:
        return 0, 0
    return drafted - begin, accepted - begin


def complete(request: Request) -> bool:
    """Whether a constrained request's text is a whole JSON value (a stop string cuts the text short
    of the tokens: after a whole value only the end-of-sequence token is legal)."""
    return request.grammar.complete(len(request.generated)) and not request.stop_string
