"""`/metrics` and `/health` read the engine's stats as its thread published them: scraped in a tight
loop while requests come and go, every scrape answers 200 (once they iterated the engine's live
request table on the HTTP event loop, and a scrape could meet "dictionary changed size during
iteration", answered with a 500). An in-process server on the loopback, over a tiny model; the
scrapes are bounded in count and time, and the interpreter switches threads often while they run."""

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
from tests.conftest import loaded, make_tiny_model

REQUESTS = 300  # requests that come and go while the scrapes run (sent at once: a long table to read)
SCRAPES = 20000  # at most, over both routes
SECONDS = 30.0  # at most


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def url():
    # One row: the other requests wait in the engine's table, so a scrape that read it would read a long
    # table while requests enter and leave it.
    runtime = build_runtime(loaded(make_tiny_model(dtype=torch.float32)),
                            Settings(drafters=["none", "ngram"], max_batch=1, calibrate=False, prefix_cache_mb=1))
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
            body = {"prompt": [1 + i % 50, 2, 3, 4 + i % 7], "max_tokens": 12 + i % 4, "temperature": 0}
            return (await client.post(f"{url}/v1/completions", json=body, timeout=600)).status_code

        return list(await asyncio.gather(*(one(i) for i in range(REQUESTS))))


def _scrape(url: str, done: threading.Event, answers: list[tuple[str, int]]) -> None:
    """Scrape the two routes in turn until `done`, or the count or time runs out."""
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        while not done.is_set() and len(answers) < SCRAPES and time.monotonic() - started < SECONDS:
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
    assert statuses == [200] * REQUESTS
    assert len(scrapes) >= 20, "too few scrapes to tell"
    failed = [(path, status) for path, status in scrapes if status != 200]
    assert failed == [], f"{len(failed)} of {len(scrapes)} scrapes failed: {failed[:5]}"
