"""Where ``run.log`` sends the values it accepted: the server, or the console.

``init()`` chooses the sink once: :class:`ServerSink` under the server, :class:`ConsoleSink`
for a standalone run. ``run.log`` has already checked and converted the values (a finite float
or None per name) and decided that this rank records them.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from trainhouse.sdk._metrics import Point
from trainhouse.sdk._server import ServerLink

#: a step's values as ``run.log`` passes them on: (name, finite value or None), in order
Values = list[tuple[str, float | None]]


class MetricsSink(ABC):
    """The destination of a run's metric values."""

    @abstractmethod
    def log(self, step: int, values: Values, *, all_ranks: bool) -> None:
        """Record ``values`` at ``step``: the job's values on the main rank; with
        ``all_ranks=True`` also this rank's own (see ``Run.log``)."""

    @abstractmethod
    def set_total_steps(self, total: int) -> None:
        """The number of steps of the run, for progress bars."""

    @abstractmethod
    def close(self) -> None:
        """At the run's end: deliver what is left."""


class ConsoleSink(MetricsSink):
    """A standalone run's metrics: the main rank prints ``[trainhouse] step N: k=v ...`` at most
    once a second (step 0 always), and at the end the last values if they were not printed."""

    def __init__(self, *, is_main: bool) -> None:
        self.is_main = is_main
        self._last_print = 0.0
        self._printed_step: int | None = None
        self._last_values: tuple[int, Values] | None = None

    def log(self, step: int, values: Values, *, all_ranks: bool) -> None:
        now = time.time()
        self._last_values = (step, values)
        if self.is_main and (now - self._last_print >= 1.0 or step == 0):
            self._print(step, values)

    def set_total_steps(self, total: int) -> None:
        return None  # nobody shows a progress bar of a standalone run

    def close(self) -> None:
        if self.is_main and self._last_values is not None:
            step, values = self._last_values
            if step != self._printed_step:  # the console always shows the final values
                self._print(step, values)

    def _print(self, step: int, values: Values) -> None:
        self._last_print = time.time()
        self._printed_step = step
        shown = " ".join(f"{k}={v:.4g}" if v is not None else f"{k}=nan" for k, v in values)
        print(f"[trainhouse] step {step}: {shown}", flush=True)


class ServerSink(MetricsSink):
    """Metrics of a run under the server: buffered in the rank's reporter, sent in the background.

    The main rank's values are the job's (no rank); values logged with ``all_ranks=True`` are also
    kept tagged with the rank that logged them, which starts that rank's reporter if need be.
    """

    def __init__(self, link: ServerLink, *, rank: int, is_main: bool) -> None:
        self.link = link
        self.rank = rank
        self.is_main = is_main

    def log(self, step: int, values: Values, *, all_ranks: bool) -> None:
        now = time.time()
        points: list[Point] = []
        if self.is_main:
            points.extend((step, k, v, None, now) for k, v in values)
        reporter = self.link.reporter
        if all_ranks:
            points.extend((step, k, v, self.rank, now) for k, v in values)
            reporter = self.link.reporting()
        if reporter is not None:
            reporter.add(points)

    def set_total_steps(self, total: int) -> None:
        if self.link.reporter is not None:
            self.link.reporter.total_steps = int(total)

    def close(self) -> None:
        self.link.close()
