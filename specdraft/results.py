"""Result values several floors share, in a module that imports nothing of specdraft: a token's
log-probabilities (`TokenLogprob`, made by the verifier, written out by the API) and the prefix
cache's figures (`PrefixStats`, kept by the cache, published by the engine, scraped by the server)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability, and the `top` most likely tokens at its position (as many
    as its request asked for), most likely first, as (token id, log-probability)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class PrefixStats:
    """What the prefix cache holds (bytes of entries) and has dropped to stay within its budget (runs
    of tokens, tokens). A request's own hit is its `RequestMetrics.cached_tokens`."""

    bytes: int = 0
    evicted_tokens: int = 0
    evictions: int = 0
