"""``run.should_stop()``: whether the server asks the job to stop, agreed among the ranks.

A :class:`StopSignal` tells one rank what it heard (:class:`ServerStop`: the server's answer to
the reporter; :class:`NeverStop`: a standalone run, which nobody can stop this way).
:class:`Preemption` turns it into one answer that every rank gets at the same call.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from trainhouse.sdk._distributed import DistributedContext
from trainhouse.sdk._server import ServerLink

# How often (in seconds of training) the ranks agree on should_stop(); see Preemption.should_stop.
STOP_SYNC_SECONDS = 0.5


class StopSignal(ABC):
    """What this rank alone knows about a request to stop."""

    @abstractmethod
    def requested(self) -> bool:
        """Whether a stop was requested (once True, it stays True)."""

    def reason(self) -> str | None:
        """Why, as the server said it (``pruned``, ``preempted``, ...), once requested."""
        return None


class NeverStop(StopSignal):
    """A standalone run: no server, no stop request."""

    def requested(self) -> bool:
        return False


class ServerStop(StopSignal):
    """The server's stop request (cancel, preemption, time limit), as the reporter heard it."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    def requested(self) -> bool:
        return self.link.stop_requested()

    def reason(self) -> str | None:
        reporter = self.link.reporter
        return reporter.stop_reason if reporter is not None and self.requested() else None


class Preemption:
    """The ranks' common answer to "should we stop?" (``run.should_stop()``).

    Collective: every rank must call :meth:`should_stop` the same number of times. Ranks agree
    through one small all-reduce about every ``STOP_SYNC_SECONDS`` of training, not at every call:
    the main rank measures how often it is called and picks the number of calls until the next
    agreement. Once the answer is True it stays True.

    ``since`` is when the run started (``time.monotonic()``): the first agreement, at the first
    call, measures the rate of calls from there.
    """

    def __init__(
        self, signal: StopSignal, distributed: DistributedContext, *, since: float
    ) -> None:
        self.signal = signal
        self.distributed = distributed
        self._agreed = False
        self._calls = 0
        self._next_sync = 1
        self._synced_at = 0
        self._last_sync = since

    def should_stop(self) -> bool:
        """True once a stop was requested, on every rank at the same call."""
        if self._agreed:
            return True
        dist = self.distributed
        if not dist.active:
            self._agreed = self.signal.requested()
            return self._agreed
        self._calls += 1
        if self._calls < self._next_sync:
            return False
        interval = 0.0
        if dist.is_main:
            elapsed = max(time.monotonic() - self._last_sync, 1e-6)
            rate = (self._calls - self._synced_at) / elapsed
            interval = float(min(max(int(rate * STOP_SYNC_SECONDS), 1), 10_000))
        flags = dist.all_reduce_max([1.0 if self.signal.requested() else 0.0, interval])
        self._last_sync = time.monotonic()
        self._synced_at = self._calls
        self._next_sync = self._calls + max(int(flags[1]), 1)
        self._agreed = bool(flags[0] > 0)
        return self._agreed
