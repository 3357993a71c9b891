"""`/metrics` and `/health` read the engine's stats as its thread published them: scraped in a tight
loop while requests come and go, every scrape answers 200 (once they iterated the engine's live
request table on the HTTP event loop, and a scrape could meet "dictionary changed size during
iteration", answered with a 500). An in-process server on the loopback, over a tiny model; the
scrapes are bounded in count and time, and the interpreter switches threads often while they run.
The engine's request table is one that only the engine's thread may read (`_EngineThreadOnly`): a
read from any other thread fails the scrape at once, on every run, not only when the race strikes."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import httpx
import pytest
import torch
import uvicorn

from specdraft.api.server import create_app
from specdraft.runtime import build_runtime
from specdraft.settings import Settings
from tests.helpers.tiny import loaded, make_tiny_model

REQUESTS = 60  # requests that come and go while the scrapes run
SCRAPES = (200, 4000)  # at least (while requests come and go, or after), at most; over both routes
SECONDS = 30.0  # at most
ENGINE_THREAD = "specdraft-engine"  # `EngineService`'s thread


class _EngineThreadOnly(dict):
    """A request table that raises when a thread other than the engine's iterates it."""

    def _owner(self) -> None:
        if threading.current_thread().name != ENGINE_THREAD:
            raise RuntimeError(f"the engine's live request table read on thread {threading.current_thread().name!r}")

    def __iter__(self):
        self._owner()
        return super().__iter__()

    def keys(self):
        self._owner()
        return super().keys()

    def values(self):
        self._owner()
        return super().values()

    def items(self):
        self._owner()
        return super().items()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def url():
    runtime = build_runtime(loaded(make_tiny_model(dtype=torch.float32)),
                            Settings(drafters=["none", "ngram"], max_batch=2, calibrate=False, prefix_cache_mb=1))
    runtime.engine._requests = _EngineThreadOnly()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(runtime, max_queued=REQUESTS), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


async def _requests(url: str) -> list[int]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:  # all in flight at once
        async def one(i: int) -> int:
            body = {"prompt": [1 + i % 50, 2, 3, 4 + i % 7], "max_tokens": 4 + i % 4, "temperature": 0}
            return (await client.post(f"{url}/v1/completions", json=body, timeout=600)).status_code

        return list(await asyncio.gather(*(one(i) for i in range(REQUESTS))))


def _scrape(url: str, done: threading.Event, answers: list[tuple[str, int]]) -> None:
    """Scrape the two routes in turn until `done` and at least the fewest scrapes, or the most, or the time runs out."""
    started, (fewest, most) = time.monotonic(), SCRAPES
    with httpx.Client(timeout=30) as client:
        while ((not done.is_set() or len(answers) < fewest) and len(answers) < most
               and time.monotonic() - started < SECONDS):
            path = "/metrics" if len(answers) % 2 else "/health"
            answers.append((path, client.get(f"{url}{path}").status_code))


def test_metrics_and_health_scraped_while_requests_come_and_go_never_fail(url):
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: a read that races the engine's thread shows
    done, scrapes = threading.Event(), []
    scrapers = [threading.Thread(target=_scrape, args=(url, done, scrapes)) for _ in range(2)]
    try:
        for scraper in scrapers:
            scraper.start()
        statuses = asyncio.run(_requests(url))
    finally:
        done.set()
        for scraper in scrapers:
            scraper.join()
        sys.setswitchinterval(interval)
    failed = [(path, status) for path, status in scrapes if status != 200]
    assert failed == [], f"{len(failed)} of {len(scrapes)} scrapes failed: {failed[:5]}"
    assert statuses == [200] * REQUESTS
    assert len(scrapes) >= SCRAPES[0], "too few scrapes to tell"
