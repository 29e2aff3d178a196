"""When an attempt being stopped gets SIGTERM and SIGKILL: one schedule for every executor.

A stop either terminates now (SIGTERM, then SIGKILL after the grace period) or lets the job stop
by itself (its ``should_stop()`` turns true): SIGTERM only once the grace period is over, SIGKILL
:data:`KILL_AFTER_TERM` seconds later. A second stop request can only make it sooner; SIGKILL is
repeated every :data:`KILL_AFTER_TERM` seconds until the attempt is gone.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from trainhouse.core.lifecycle import StopReason

__all__ = ["KILL_AFTER_TERM", "StopTimer"]

KILL_AFTER_TERM = 5.0  # seconds between SIGTERM and SIGKILL


@dataclass
class StopTimer:
    """An attempt's stop: why, and when its signals are due (``time.monotonic()`` seconds)."""

    reason: StopReason | None = None
    term_at: float | None = None  # when SIGTERM is (or was) due
    term_sent: bool = False
    kill_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.term_at is not None

    def request(self, now: float, *, grace: float, reason: StopReason, terminate: bool) -> bool:
        """Schedule the stop, or bring it forward; False when it was due at least this soon."""
        term_at = now if terminate else now + grace
        kill_at = now + grace if terminate else now + grace + KILL_AFTER_TERM
        if self.term_at is not None and self.kill_at is not None:
            if term_at >= self.term_at and kill_at >= self.kill_at:
                return False  # already stopping at least this fast
            term_at, kill_at = min(term_at, self.term_at), min(kill_at, self.kill_at)
        self.reason = self.reason or reason
        self.term_at, self.kill_at = term_at, kill_at
        return True

    def hasten(self, now: float) -> None:
        """SIGTERM now and SIGKILL within :data:`KILL_AFTER_TERM` (a gang that cannot go on)."""
        if self.term_at is None or self.term_at > now:
            self.term_at = now
        latest = now + KILL_AFTER_TERM
        self.kill_at = latest if self.kill_at is None else min(self.kill_at, latest)

    def term_due(self, now: float) -> bool:
        """Whether SIGTERM is due and not sent yet (it counts as sent once this says so)."""
        if self.term_at is None or self.term_sent or now < self.term_at:
            return False
        self.term_sent = True
        return True

    def kill_due(self, now: float) -> bool:
        """Whether SIGKILL is due; the next one is then due :data:`KILL_AFTER_TERM` later."""
        if self.kill_at is None or now < self.kill_at:
            return False
        self.kill_at = now + KILL_AFTER_TERM
        return True

    def due(self, now: float) -> list[signal.Signals]:
        """The signals due now, in order (SIGTERM once, then SIGKILL)."""
        return [
            sig
            for sig, is_due in (
                (signal.SIGTERM, self.term_due(now)),
                (signal.SIGKILL, self.kill_due(now)),
            )
            if is_due
        ]
