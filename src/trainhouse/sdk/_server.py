"""A rank's link to the server during a job: the job's API and the rank's metric reporter.

The metrics sink, the stop signal and the checkpoint registry of a run under the server share one
link: the reporter sends the metrics, brings back the server's stop requests and registers the
checkpoints whose registration had to wait for the server.
"""

from __future__ import annotations

from pathlib import Path

from trainhouse.sdk._metrics import Reporter
from trainhouse.sdk._transport import JobAPI


class ServerLink:
    """The job's API and, once this rank has metrics to send, its :class:`Reporter`.

    The main rank's reporter starts with the link (it also sends the job's heartbeats); another
    rank's starts on its first ``run.log(..., all_ranks=True)`` (:meth:`reporting`), so until then
    ``reporter`` is None there. ``spool`` is where the reporter keeps the points the server could
    not take by the end (the attempt's directory), or None.
    """

    def __init__(self, api: JobAPI, attempt: int, *, spool: Path | None, report: bool) -> None:
        self.api = api
        self.attempt = attempt
        self.spool = spool
        self.reporter: Reporter | None = None
        if report:
            self.reporting()

    def reporting(self) -> Reporter:
        """This rank's reporter, started now if it has none yet."""
        if self.reporter is None:
            self.reporter = Reporter(self.api, self.attempt, spool=self.spool)
        return self.reporter

    def stop_requested(self) -> bool:
        """Whether the server has asked the job to stop (it answers the reporter's requests)."""
        return self.reporter is not None and self.reporter.stop_requested.is_set()

    def close(self) -> None:
        """Send what is left (spooled if the server cannot take it), then close the API."""
        if self.reporter is not None:
            self.reporter.close()
        self.api.close()
