"""Prometheus metrics of a serving engine, in a registry of its own (several servers in one process,
as in tests, do not collide). Updated on the engine thread after each step; scraped at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdraft.engine import Completion, EngineStats

STEP_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdraft_requests", "Requests by outcome", ["outcome"], registry=r)
        self.generated = Counter("specdraft_generated_tokens", "Tokens generated", ["drafter"], registry=r)
        self.drafted = Counter("specdraft_draft_tokens", "Draft tokens verified", ["drafter"], registry=r)
        self.accepted = Counter("specdraft_accepted_tokens", "Draft tokens accepted", ["drafter"], registry=r)
        self.position_drafted = Counter("specdraft_position_drafted", "Drafts that reached a position", ["position"], registry=r)
        self.position_accepted = Counter("specdraft_position_accepted", "Drafts accepted at a position", ["position"], registry=r)
        self.step_seconds = Histogram("specdraft_step_seconds", "Engine step latency", buckets=STEP_BUCKETS, registry=r)
        self.ttft = Histogram("specdraft_time_to_first_token_seconds", "Time to first token", buckets=TTFT_BUCKETS, registry=r)
        self.queue_depth = Gauge("specdraft_queue_depth", "Requests waiting for a row or for their prefill", registry=r)
        self.running = Gauge("specdraft_running_rows", "Requests decoding", registry=r)
        self.prompt_tokens = Counter("specdraft_prompt_tokens", "Prompt tokens of finished requests, by where their "
                                     "keys and values came from", ["source"], registry=r)
        self.prefix_bytes = Gauge("specdraft_prefix_cache_bytes", "Bytes of keys and values the prefix cache holds", registry=r)
        self.prefix_evictions = Gauge("specdraft_prefix_cache_evictions", "Entries the prefix cache dropped to stay "
                                      "within its budget (runs of tokens)", registry=r)
        self.prefix_evicted = Gauge("specdraft_prefix_cache_evicted_tokens", "Tokens the prefix cache dropped", registry=r)

    def on_step(self, seconds: float) -> None:
        self.step_seconds.observe(seconds)

    def on_finish(self, completion: Completion) -> None:
        m = completion.metrics
        self.requests.labels(outcome=completion.finish_reason).inc()
        self.generated.labels(drafter=m.drafter).inc(len(completion.token_ids))
        self.drafted.labels(drafter=m.drafter).inc(m.draft_tokens)
        self.accepted.labels(drafter=m.drafter).inc(m.accepted_tokens)
        self.prompt_tokens.labels(source="cached").inc(m.cached_tokens)
        self.prompt_tokens.labels(source="computed").inc(len(completion.prompt_token_ids) - m.cached_tokens)
        for position, (drafted, accepted) in enumerate(zip(m.drafted_at.tolist(), m.accepted_at.tolist()), start=1):
            if drafted:
                self.position_drafted.labels(position=str(position)).inc(drafted)
                self.position_accepted.labels(position=str(position)).inc(accepted)
        if m.time_to_first_token is not None:
            self.ttft.observe(m.time_to_first_token)

    def refused(self, outcome: str) -> None:
        """A request refused before it reached the engine (bad input, overload)."""
        self.requests.labels(outcome=outcome).inc()

    def render(self, stats: EngineStats) -> bytes:
        self.running.set(stats.running)
        self.queue_depth.set(stats.waiting)
        prefixes = stats.prefix_cache
        if prefixes is not None:
            self.prefix_bytes.set(prefixes.bytes)
            self.prefix_evictions.set(prefixes.evictions)
            self.prefix_evicted.set(prefixes.evicted_tokens)
        return generate_latest(self.registry)
