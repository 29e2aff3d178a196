"""Log retention: the logs of jobs that ended longer ago than ``--log-retention`` are deleted.

Logs outlive their job by default (forever); a retention deletes each ended job's
``logs/`` directory once the job has been over for that long and notes it in the job's events
(``trainhouse show``). Checked at start-up and every few minutes. The job wrote that directory:
it is removed through :mod:`trainhouse.jobfs.jobfiles`, never through a link.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.lifecycle import JobState
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import JobLayout
from trainhouse.store import Store

log = logging.getLogger(__name__)

CHECK_SECONDS = 300.0
DELETED_NOTE = "logs deleted by the log retention policy"


def expire_logs(store: Store, home: Path, retention: float, *, now: float | None = None) -> int:
    """Delete the logs of jobs that ended more than ``retention`` seconds ago; how many."""
    cutoff = (now if now is not None else time.time()) - retention
    ended = [s for s in JobState if s.terminal]
    removed = 0
    for job in store.jobs.list(states=ended):
        if job.ended_at is None or job.ended_at > cutoff:
            continue
        logs = JobLayout(home, job.id).logs
        try:
            if jobfiles.lstat(home, logs) is None:
                continue
            jobfiles.remove(home, logs)  # a link is removed itself, not what it names
        except OSError as exc:
            log.warning("job %s: logs not deleted: %s", job.id, exc)
            continue
        days = retention / 86400
        store.jobs.add_event(job.id, f"{DELETED_NOTE} ({days:g} d after the job ended)")
        removed += 1
    if removed:
        log.info("deleted the logs of %d jobs older than the retention", removed)
    return removed


class LogRetention(BackgroundLoop):
    """Applies the log retention at start-up and every few minutes (when one is set)."""

    name = "trainhouse-housekeeping"

    def __init__(self, store: Store, home: Path, log_retention: float | None) -> None:
        super().__init__(CHECK_SECONDS)
        self.store = store
        self.home = home
        self.log_retention = log_retention

    @property
    def enabled(self) -> bool:
        return bool(self.log_retention)

    def tick(self) -> None:
        if self.log_retention:
            expire_logs(self.store, self.home, self.log_retention)
