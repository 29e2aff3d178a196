"""Metric batches an attempt could not send: stored when the server records the attempt's end.

The SDK writes them to ``attempts/<n>/metrics-spool/*.json`` (one report payload per file) when
the server was unreachable at the end of a run. Their batch ids make storing them idempotent: a
batch that did reach the server before is skipped.
"""

from __future__ import annotations

import logging

from trainhouse.errors import InvalidMetrics
from trainhouse.layout import AttemptLayout
from trainhouse.store.metrics import MetricRepo
from trainhouse.store.reports import parse_report

log = logging.getLogger(__name__)


def ingest_spool(metrics: MetricRepo, job_id: int, attempt: AttemptLayout) -> int:
    """Store every spooled batch of an attempt, oldest first; returns the points written."""
    spool = attempt.spool
    if not spool.is_dir():
        return 0
    written = 0
    for path in sorted(spool.glob("*.json")):
        try:
            report = parse_report(path.read_bytes())  # the same checks as a live report
            resume = report.resume_step
            written += metrics.add(
                job_id,
                report.columns,
                batch_id=report.batch_id,
                total_steps=report.total_steps,
                resume=(report.attempt, resume) if resume is not None else None,
            )
        except (OSError, InvalidMetrics) as exc:
            log.error("job %s: cannot read spooled metrics %s: %s", job_id, path, exc)
            path.rename(path.with_suffix(".bad"))
            continue
        path.unlink()
    if written:
        log.info("job %s: stored %d spooled metric points", job_id, written)
    return written
