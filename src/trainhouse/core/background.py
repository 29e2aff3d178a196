"""Background loops: a thread that ticks until it is stopped, started and stopped by the app;
and a bounded pool of background work that requests hand long reads to.

The server runs a handful of loops (the scheduler loop, checkpoint retention, the resource
sampler, log retention). Each subclass says what one :meth:`BackgroundLoop.tick` does and how long
to wait before the next (:attr:`BackgroundLoop.interval`, or until :meth:`BackgroundLoop.wake` for
``None``); starting, waking, stopping, error logging and the final tick live here once. The app
starts its loops in order and stops them in the reverse order.

:class:`WorkPool` runs work a request must not do on its own thread (hashing or copying the
files a job wrote, as large as a job makes them): at most ``workers`` pieces at once, at most
``queue`` more waiting, :class:`~trainhouse.core.errors.ServerBusy` (503, ``Retry-After``) past
that; a piece submitted again under the key of one queued or running joins it. Standard library
only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar

from trainhouse.core.errors import ServerBusy

__all__ = ["BackgroundLoop", "WorkPool"]

T = TypeVar("T")

log = logging.getLogger(__name__)

MIN_WAIT = 0.05  # seconds between two ticks at least


class BackgroundLoop:
    """A thread running :meth:`tick` every ``interval`` seconds (``None``: when woken).

    Subclasses override :meth:`tick`, and optionally :meth:`on_start` (before the thread runs),
    :meth:`on_stop` (after it ended), :meth:`next_wait`, :attr:`enabled` and
    :attr:`final_tick` (one more tick after the stop, for work queued before it).
    """

    #: the thread's name
    name = "trainhouse-service"
    #: seconds :meth:`stop` waits for the thread
    join_timeout = 30.0
    #: tick once more after stop() (work queued before the stop is not dropped)
    final_tick = False

    def __init__(self, interval: float | None) -> None:
        self.interval = interval
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether :meth:`start` runs the thread at all."""
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- life ------------------------------------------------------------------------------
    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stopping.clear()
        self._wake.clear()
        self.on_start()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tick now rather than at the end of the current wait."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout)
            self._thread = None
        self.on_stop()

    def on_start(self) -> None:
        """Called by :meth:`start` before the thread runs."""

    def on_stop(self) -> None:
        """Called by :meth:`stop` once the thread has ended."""

    # -- the thread ------------------------------------------------------------------------
    def tick(self) -> object:
        """One round of the service's work (what it returns is for callers that tick by hand)."""
        raise NotImplementedError

    def next_wait(self, elapsed: float) -> float | None:
        """Seconds to wait after a tick that took ``elapsed`` (None: until woken)."""
        return self.interval

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:  # keep going; the error is in the server log
            log.exception("%s: a tick failed", self.name)

    def _run(self) -> None:
        while not self._stopping.is_set():
            began = time.monotonic()
            self._safe_tick()
            wait = self.next_wait(time.monotonic() - began)
            self._wake.wait(None if wait is None else max(wait, MIN_WAIT))
            self._wake.clear()
        if self.final_tick:
            self._safe_tick()


class WorkPool:
    """At most ``workers`` pieces of work at once, on threads of their own, and at most
    ``queue`` more waiting (in the order they came); past that, :meth:`submit` raises
    ServerBusy with ``retry_after``. A piece is a function of the pool's stop event (set by
    :meth:`stop`: a long piece checks it between chunks and gives up). Threads start on the
    first submit."""

    def __init__(self, name: str, *, workers: int, queue: int, retry_after: float = 5.0) -> None:
        if workers < 1 or queue < 0:
            raise ValueError(
                f"a work pool needs workers >= 1 and queue >= 0, got {workers}, {queue}"
            )
        self.name = name
        self.workers = workers
        self.queue = queue
        self.retry_after = retry_after
        self.stopping = threading.Event()
        self._lock = threading.Condition()
        self._waiting: deque[tuple[Hashable, Callable[[threading.Event], Any]]] = deque()
        self._futures: dict[Hashable, Future[Any]] = {}  # queued or running, by key
        self._running = 0
        self._threads: list[threading.Thread] = []

    def submit(self, key: Hashable, what: str, work: Callable[[threading.Event], T]) -> Future[T]:
        """Run ``work(stopping)`` on the pool; its future. The future of the piece queued or
        running under ``key`` when there is one (``work`` is dropped). ServerBusy (naming
        ``what``) when ``workers`` run and ``queue`` wait, or once the pool is stopping."""
        with self._lock:
            if self.stopping.is_set():
                raise ServerBusy(f"the server is stopping: {what} was not started")
            found = self._futures.get(key)
            if found is not None:
                return found
            if self._running + len(self._waiting) >= self.workers + self.queue:
                raise ServerBusy(
                    f"the server is busy reading jobs' files ({self._running} running, "
                    f"{len(self._waiting)} waiting, the most it takes: {self.workers} and "
                    f"{self.queue}); {what} was not started, try again later",
                    retry_after=self.retry_after,
                )
            future: Future[T] = Future()
            self._futures[key] = future
            self._waiting.append((key, work))
            while len(self._threads) < self.workers:
                thread = threading.Thread(
                    target=self._run, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._lock.notify()
            return future

    def load(self) -> tuple[int, int]:
        """Pieces running and waiting now."""
        with self._lock:
            return self._running, len(self._waiting)

    def stop(self, timeout: float = 5.0) -> None:
        """Refuse new work, fail what waits (ServerBusy), set the stop event for what runs and
        wait up to ``timeout`` seconds for the threads."""
        with self._lock:
            self.stopping.set()
            dropped = [self._futures.pop(key) for key, _ in self._waiting]
            self._waiting.clear()
            self._lock.notify_all()
            threads, self._threads = self._threads, []
        for future in dropped:
            future.set_exception(ServerBusy("the server stopped before this work started"))
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self.stopping.is_set():
                    self._lock.wait()
                if self.stopping.is_set():
                    return
                key, work = self._waiting.popleft()
                future = self._futures[key]
                self._running += 1
            try:
                result = work(self.stopping)
            except BaseException as exc:  # handed to whoever waits
                outcome: tuple[bool, Any] = (False, exc)
            else:
                outcome = (True, result)
            with self._lock:
                self._running -= 1
                self._futures.pop(key, None)
            if outcome[0]:
                future.set_result(outcome[1])
            else:
                future.set_exception(outcome[1])
