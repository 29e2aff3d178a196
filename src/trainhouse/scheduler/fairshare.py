"""Fair-share usage: decayed cluster-seconds per user, with an entry charge at every start.

A running job adds its cost rate (the fraction of the cluster's GPUs it holds, or of its CPU
cores for a CPU job) for every second it runs. All usage decays with a half-life (default
7 days), so last month's burst does not count against a user forever. Each start also charges
``entry_seconds`` of the job's rate up front, so submitting many short jobs at once cannot
game the order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_HALF_LIFE = 7 * 86400.0
DEFAULT_ENTRY_SECONDS = 300.0


class UsageLedger:
    def __init__(
        self,
        values: dict[str, float] | None = None,
        *,
        at: float,
        half_life: float = DEFAULT_HALF_LIFE,
        entry_seconds: float = DEFAULT_ENTRY_SECONDS,
    ) -> None:
        if half_life <= 0:
            raise ValueError(f"the fair-share half-life must be > 0 s, got {half_life}")
        self.values: dict[str, float] = dict(values or {})
        self.at = at
        self.half_life = half_life
        self.entry_seconds = entry_seconds

    def advance(self, now: float, running: Iterable[tuple[str, float]]) -> None:
        """Decay everything to ``now``, then add ``rate * elapsed`` for each running job."""
        dt = now - self.at
        if dt <= 0:
            return
        factor = math.pow(0.5, dt / self.half_life)
        for owner in self.values:
            self.values[owner] *= factor
        # the usage accrued during dt, decayed from its midpoint (exact for a constant rate
        # up to the second order)
        mid = math.pow(0.5, dt / 2 / self.half_life)
        for owner, rate in running:
            self.values[owner] = self.values.get(owner, 0.0) + rate * dt * mid
        self.at = now

    def charge_start(self, owner: str, rate: float) -> None:
        self.values[owner] = self.values.get(owner, 0.0) + rate * self.entry_seconds

    def snapshot(self) -> dict[str, float]:
        return dict(self.values)
