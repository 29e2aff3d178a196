"""Metric batches an attempt could not send: stored when the server records the attempt's end.

The SDK writes them to ``attempts/<n>/metrics-spool/*.json`` (one report payload per file) when
the server was unreachable at the end of a run. Their batch ids make storing them idempotent: a
batch that did reach the server before is skipped.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from trainhouse.store.records import MetricPoint
from trainhouse.store.store import Store

log = logging.getLogger(__name__)

SPOOL_DIR = "metrics-spool"  # the SDK's name for it (trainhouse.sdk.metrics.SPOOL_DIR)


def _points(payload: dict[str, Any]) -> list[MetricPoint]:
    attempt = int(payload["attempt"])
    points = []
    for step, name, value, rank, wall in payload["points"]:
        number = float(value) if value is not None else None
        points.append(
            MetricPoint(
                step=int(step),
                name=str(name)[:256],
                value=number if number is not None and math.isfinite(number) else None,
                rank=None if rank is None else int(rank),
                attempt=attempt,
                wall_time=float(wall),
            )
        )
    return points


def ingest_spool(store: Store, job_id: int, attempt_dir: Path) -> int:
    """Store every spooled batch of an attempt, oldest first; returns the points written."""
    spool = attempt_dir / SPOOL_DIR
    if not spool.is_dir():
        return 0
    written = 0
    for path in sorted(spool.glob("*.json")):
        try:
            payload = json.loads(path.read_text())
            points = _points(payload)
            resume = payload.get("resume_step")
            written += store.add_metrics(
                job_id,
                points,
                batch_id=str(payload["batch_id"])[:64],
                total_steps=payload.get("total_steps"),
                resume=(int(payload["attempt"]), int(resume)) if resume is not None else None,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("job %s: cannot read spooled metrics %s: %s", job_id, path, exc)
            path.rename(path.with_suffix(".bad"))
            continue
        path.unlink()
    if written:
        log.info("job %s: stored %d spooled metric points", job_id, written)
    return written
