"""`EngineService`: one thread owns the engine; everything else talks to it through an inbox.

Submissions and cancellations are queued and applied between steps, never mid-step. Each request's
output (its `Delta`s, then its `Completion` or an error) is handed to its asyncio queue on the
caller's event loop with `loop.call_soon_threadsafe`. The thread sleeps while there is no work.
Admission is bounded: beyond `max_batch` running rows and `max_queued` waiting requests a submission
is refused at once (`Overloaded`), and after `shutdown` begins every submission is (`ShuttingDown`).
A step that raises fails the requests it was serving with an error event; the service goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from specdraft.engine import Completion, Delta, Engine, EngineStats, ResolvedRequest
from specdraft.params import DEFAULT_MAX_QUEUED, DEFAULT_SAVE_EVERY

log = logging.getLogger("specdraft.service")


class Overloaded(Exception):
    """Admission is full: as many requests running and waiting as the service takes."""


class ShuttingDown(Exception):
    """The service is stopping and takes no new requests."""


@dataclass(frozen=True)
class Failed:
    """The last event of a request that could not finish: why."""

    message: str


Event = Delta | Completion | Failed


@dataclass(frozen=True)
class _Cancel:
    """An inbox item: cancel a request (`request_id`), or every live one (None)."""

    request_id: str | None = None


@dataclass
class _Submission:
    request: ResolvedRequest
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop


class EngineService:
    """engine: owned by the service's thread from `start` on; max_queued: requests that may wait for
    a row; on_step(seconds) and on_finish(completion): called on the engine thread after every step
    and for every request that ends, finished, failed or cancelled (metrics); every_seconds,
    periodic: a task run on the engine thread between steps (e.g. saving a memory)."""

    def __init__(self, engine: Engine, max_queued: int = DEFAULT_MAX_QUEUED, on_step: Callable[[float], None] | None = None,
                 on_finish: Callable[[Completion], None] | None = None,
                 periodic: Callable[[], None] | None = None, every_seconds: float = DEFAULT_SAVE_EVERY) -> None:
        if max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {max_queued}")
        self.engine, self.max_queued = engine, max_queued
        self._on_step, self._on_finish = on_step, on_finish
        self._periodic, self._every = periodic, every_seconds
        self._inbox: deque[_Submission | _Cancel] = deque()
        self._wake = threading.Condition()
        self._live: dict[str, _Submission] = {}  # submitted and not yet finished (engine thread only)
        self._admitted = 0  # submitted and not yet finished, counted at submission (any thread)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specdraft-engine", daemon=True)

    # -- any thread --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def capacity(self) -> int:
        return self.engine.max_batch + self.max_queued

    @property
    def stopping(self) -> bool:
        return self._stopping

    def submit(self, request: ResolvedRequest) -> asyncio.Queue:
        """Queue a request as `engine.resolve` resolved it (the engine takes it as it is); return the
        queue its events arrive on. Call from a coroutine: the events are delivered on its event loop."""
        loop = asyncio.get_running_loop()
        with self._wake:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._admitted >= self.capacity:
                raise Overloaded(f"the server is at capacity ({self.engine.max_batch} running and "
                                 f"{self.max_queued} waiting requests); retry later")
            self._admitted += 1
            submission = _Submission(request, asyncio.Queue(), loop)
            self._inbox.append(submission)
            self._wake.notify()
        return submission.queue

    def cancel(self, request_id: str) -> None:
        """Stop a request (its client went away); its rows and drafter state are freed before the next step."""
        with self._wake:
            self._inbox.append(_Cancel(request_id))
            self._wake.notify()

    @property
    def stats(self) -> EngineStats:
        """The engine's latest snapshot, for metrics: published by the engine's thread after each step
        and as requests come and go; reading it never touches the engine's live tables."""
        return self.engine.stats

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new requests, let the admitted ones finish for up to `timeout` seconds, cancel the
        rest, and stop the thread (after its last periodic task: e.g. the memory is saved)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._wake:
                self._inbox.append(_Cancel())
                self._wake.notify()
            self._thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        last_periodic = time.monotonic()
        while True:
            with self._wake:
                while not self._inbox and not self.engine.has_work and not (self._stopping and not self._live):
                    self._wake.wait(timeout=self._every if self._periodic else None)
                    if self._periodic and time.monotonic() - last_periodic >= self._every:
                        break
                inbox, self._inbox = list(self._inbox), deque()
                if self._stopping and not self._live and not inbox:
                    break
            for item in inbox:
                self._apply(item)
            if self.engine.has_work:
                self._step()
            if self._periodic and time.monotonic() - last_periodic >= self._every:
                last_periodic = time.monotonic()
                self._run_periodic()
        self._run_periodic()

    def _apply(self, item: _Submission | _Cancel) -> None:
        if isinstance(item, _Cancel):
            for request_id in [item.request_id] if item.request_id is not None else list(self._live):
                if request_id in self._live:
                    self.engine.cancel(request_id)
                    self._finish(request_id, self.engine.collect(request_id))
            return
        request_id = item.request.id
        self._live[request_id] = item
        try:
            self.engine.enqueue(item.request)
        except Exception as exc:  # noqa: BLE001 - resolved before; report rather than lose the thread
            log.exception("could not enqueue request %s", request_id)
            self._finish(request_id, Failed(str(exc)))

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            deltas = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - one bad step must not take the server down
            log.exception("engine step failed")
            for request_id in list(self._live):
                try:
                    self.engine.cancel(request_id)
                    self.engine.collect(request_id)
                except Exception:  # noqa: BLE001 - its state is gone with the step; free what we can
                    log.exception("could not free request %s", request_id)
                self._finish(request_id, Failed(f"the engine failed on this request's step: {type(exc).__name__}: {exc}"))
            return
        if self._on_step is not None:
            self._on_step(time.perf_counter() - start)
        for delta in deltas:
            if delta.request_id in self._live:
                self._send(delta.request_id, delta)
        for delta in deltas:
            if delta.finish_reason is not None and delta.request_id in self._live:
                self._finish(delta.request_id, self.engine.collect(delta.request_id))

    def _send(self, request_id: str, event: Event) -> None:
        submission = self._live[request_id]
        try:
            submission.loop.call_soon_threadsafe(submission.queue.put_nowait, event)
        except RuntimeError:  # the client's event loop is closed: nobody is listening
            pass

    def _finish(self, request_id: str, event: Event) -> None:
        self._send(request_id, event)
        if isinstance(event, Completion) and self._on_finish is not None:
            self._on_finish(event)
        del self._live[request_id]
        with self._wake:
            self._admitted -= 1

    def _run_periodic(self) -> None:
        if self._periodic is None:
            return
        try:
            self._periodic()
        except Exception:  # noqa: BLE001 - e.g. a full disk: log it, keep serving
            log.exception("periodic task failed")
