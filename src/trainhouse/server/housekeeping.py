"""Log retention: the logs of jobs that ended longer ago than ``--log-retention`` are deleted.

Logs outlive their job by default (forever); a retention deletes each ended job's
``logs/`` directory once the job has been over for that long and notes it in the job's events
(``trainhouse show``). Checked at start-up and every few minutes.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

from trainhouse.layout import JobLayout
from trainhouse.lifecycle import JobState
from trainhouse.store import Store

log = logging.getLogger(__name__)

CHECK_SECONDS = 300.0
DELETED_NOTE = "logs deleted by the log retention policy"


def expire_logs(store: Store, home: Path, retention: float, *, now: float | None = None) -> int:
    """Delete the logs of jobs that ended more than ``retention`` seconds ago; how many."""
    cutoff = (now if now is not None else time.time()) - retention
    ended = [s for s in JobState if s.terminal]
    removed = 0
    for job in store.list_jobs(states=ended):
        if job.ended_at is None or job.ended_at > cutoff:
            continue
        logs = JobLayout(home, job.id).logs
        if not logs.is_dir():
            continue
        shutil.rmtree(logs, ignore_errors=True)
        days = retention / 86400
        store.add_event(job.id, f"{DELETED_NOTE} ({days:g} d after the job ended)")
        removed += 1
    if removed:
        log.info("deleted the logs of %d jobs older than the retention", removed)
    return removed


class Housekeeper:
    """A thread that applies the log retention now and then."""

    def __init__(self, store: Store, home: Path, log_retention: float | None) -> None:
        self.store = store
        self.home = home
        self.log_retention = log_retention
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.log_retention:
            return
        self._thread = threading.Thread(
            target=self._run, name="trainhouse-housekeeping", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        assert self.log_retention is not None
        while not self._stop.is_set():
            try:
                expire_logs(self.store, self.home, self.log_retention)
            except Exception:  # keep going; the error is in the server log
                log.exception("log retention failed")
            self._stop.wait(CHECK_SECONDS)
