"""Background loops: a thread that ticks until it is stopped, started and stopped by the app.

The server runs a handful of them (the scheduler loop, checkpoint retention, the resource sampler,
log retention). Each subclass says what one :meth:`BackgroundLoop.tick` does and how long to wait
before the next (:attr:`BackgroundLoop.interval`, or until :meth:`BackgroundLoop.wake` for
``None``); starting, waking, stopping, error logging and the final tick live here once. The app
starts its loops in order and stops them in the reverse order. Standard library only.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["BackgroundLoop"]

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
