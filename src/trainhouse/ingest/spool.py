"""Metric batches an attempt could not send: stored when the server records the attempt's end.

The SDK writes them to ``attempts/<n>/metrics-spool/*.json`` (one report payload per file) when
the server was unreachable at the end of a run. Their batch ids make storing them idempotent: a
batch that did reach the server before is skipped.

The spool is the job's to write, so it is read through :mod:`trainhouse.jobfs.jobfiles` from the
server's home: no link is followed, only regular files are read (anything else named ``*.json``
is set aside as ``*.bad``, unread), each of at most ``MAX_SPOOL_FILE`` bytes, at most
``MAX_SPOOL_FILES`` of them and ``MAX_SPOOL_TOTAL`` bytes in all per attempt (the rest stay
where they are, and the log says so). The scheduler's thread reads it: nothing here can wait
on a file.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.reports import parse_report
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.jobfiles import MAX_SPOOL_FILE, MAX_SPOOL_FILES, MAX_SPOOL_TOTAL
from trainhouse.jobfs.layout import AttemptLayout
from trainhouse.store.metrics import MetricRepo

log = logging.getLogger(__name__)


def ingest_spool(metrics: MetricRepo, job_id: int, attempt: AttemptLayout, *, within: Path) -> int:
    """Store every spooled batch of an attempt, oldest first; returns the points written.
    ``within``: the directory the attempt's lies under that the job cannot replace."""
    try:
        spool = jobfiles.open_dir(within, attempt.spool)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except OSError as exc:
        log.error("job %s: cannot read the metrics spool %s: %s", job_id, attempt.spool, exc)
        return 0
    written = 0
    with spool:
        try:
            names = [name for name, _ in spool.entries() if name.endswith(".json")]
        except OSError as exc:
            log.error("job %s: cannot list the metrics spool %s: %s", job_id, attempt.spool, exc)
            return 0
        budget = MAX_SPOOL_TOTAL
        for count, name in enumerate(names):
            st = spool.lstat(name)
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > budget:
                budget = -1
            if count >= MAX_SPOOL_FILES or budget < 0:
                log.error(
                    "job %s: %d spooled metric files left in %s: more than %d files or %d bytes",
                    job_id,
                    len(names) - count,
                    attempt.spool,
                    MAX_SPOOL_FILES,
                    MAX_SPOOL_TOTAL,
                )
                break
            try:
                data = spool.read(name, max_size=MAX_SPOOL_FILE)
                budget -= len(data)
                report = parse_report(data)  # the same checks as a live report
                resume = report.resume_step
                written += metrics.add(
                    job_id,
                    report.columns,
                    batch_id=report.batch_id,
                    total_steps=report.total_steps,
                    resume=(report.attempt, resume) if resume is not None else None,
                )
            except (OSError, InvalidMetrics) as exc:
                log.error("job %s: cannot read spooled metrics %s: %s", job_id, name, exc)
                try:
                    spool.rename(name, name.removesuffix(".json") + ".bad")
                except OSError as err:
                    log.error("job %s: cannot set %s aside: %s", job_id, name, err)
                continue
            try:
                spool.unlink(name)
            except OSError as exc:
                log.error("job %s: cannot remove spooled metrics %s: %s", job_id, name, exc)
    if written:
        log.info("job %s: stored %d spooled metric points", job_id, written)
    return written
