"""Resource samples of nodes and jobs (the ``system_metrics`` table).

The sampler (:mod:`trainhouse.monitoring.sampler`) writes one batch per interval: the node's
own values (``job_id`` NULL) and each running job's processes' values on that node. They are
read back as series, averaged into time buckets when there are more points than asked for, and
deleted once older than the retention. Both SQLite and PostgreSQL. The series' names and
units are :mod:`trainhouse.core.metricnames`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Integer, cast, delete, func, insert, select

from trainhouse.core.lifecycle import JobState
from trainhouse.core.metricnames import CPU_PERCENT, PROCESSES
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

DEFAULT_MAX_POINTS = 1000
PURGE_BATCH = 10_000


@dataclass(frozen=True)
class Sample:
    """One value of one sample: the node's (``job_id`` None) or a job's; ``gpu`` for a GPU's."""

    name: str
    value: float
    gpu: int | None = None
    job_id: int | None = None


@dataclass
class Series:
    name: str
    gpu: int | None
    points: list[tuple[float, float]] = field(default_factory=list)  # (at, value or average)
    max: list[float] = field(default_factory=list)  # each point's maximum (= value if raw)


@dataclass(frozen=True)
class Latest:
    """The newest sample of a node or a job."""

    at: float
    samples: tuple[Sample, ...]

    def value(self, name: str, gpu: int | None = None) -> float | None:
        for s in self.samples:
            if s.name == name and s.gpu == gpu:
                return s.value
        return None

    def gpus(self) -> list[int]:
        return sorted({s.gpu for s in self.samples if s.gpu is not None})


class SystemMetrics:
    """Reads and writes of ``system_metrics`` (and the job counts ``/metrics`` exposes)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def write(self, node: str, at: float, samples: Iterable[Sample]) -> int:
        """Store one sample batch in one transaction; non-finite values are left out."""
        rows = [
            {
                "node": node,
                "job_id": s.job_id,
                "name": s.name,
                "gpu": s.gpu,
                "value": float(s.value),
                "at": at,
            }
            for s in samples
            if math.isfinite(s.value)
        ]
        if rows:
            with self.db.transaction() as conn:
                conn.execute(insert(t.system_metrics), rows)
        return len(rows)

    def _where(
        self,
        node: str | None,
        job_id: int | None,
        names: Sequence[str] | None,
        since: float | None,
        until: float | None,
    ) -> list[ColumnElement[bool]]:
        c = t.system_metrics.c
        if (node is None) == (job_id is None):
            raise ValueError("give a node or a job id")
        cond: list[ColumnElement[bool]] = (
            [c.job_id == job_id] if job_id is not None else [c.node == node, c.job_id.is_(None)]
        )
        if names:
            cond.append(c.name.in_(list(names)))
        if since is not None:
            cond.append(c.at >= since)
        if until is not None:
            cond.append(c.at <= until)
        return cond

    def series(
        self,
        *,
        node: str | None = None,
        job_id: int | None = None,
        names: Sequence[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        max_points: int = DEFAULT_MAX_POINTS,
    ) -> list[Series]:
        """A node's (``node``) or a job's (``job_id``) series between ``since`` and ``until``.

        A series with more than ``max_points`` points comes back averaged into equal time
        buckets over the range (at most ``max_points``), each with its maximum too.
        """
        if max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {max_points}")
        c = t.system_metrics.c
        cond = self._where(node, job_id, names, since, until)
        with self.db.connect() as conn:
            stats = conn.execute(
                select(c.name, c.gpu, func.count(), func.min(c.at), func.max(c.at))
                .where(*cond)
                .group_by(c.name, c.gpu)
            ).all()
            if not stats:
                return []
            out = {(name, gpu): Series(name, gpu) for name, gpu, *_ in stats}
            if max(row[2] for row in stats) <= max_points:
                rows: Sequence[Any] = conn.execute(
                    select(c.name, c.gpu, c.at, c.value, c.value)
                    .where(*cond)
                    .order_by(c.name, c.gpu, c.at)
                ).all()
            else:
                t0 = float(min(row[3] for row in stats))
                t1 = float(max(row[4] for row in stats))
                # the last point falls into the last bucket, not one past it
                width = max((t1 - t0) / max_points, 1e-6) * (1 + 1e-9)
                offset = (c.at - t0) / width
                bucket = (
                    func.floor(offset) if self.db.dialect == "postgresql" else cast(offset, Integer)
                )
                inner = select(c.name, c.gpu, c.at, c.value, bucket.label("b")).where(*cond)
                sub = inner.subquery()
                rows = conn.execute(
                    select(
                        sub.c.name,
                        sub.c.gpu,
                        func.avg(sub.c.at),
                        func.avg(sub.c.value),
                        func.max(sub.c.value),
                    )
                    .group_by(sub.c.name, sub.c.gpu, sub.c.b)
                    .order_by(sub.c.name, sub.c.gpu, sub.c.b)
                ).all()
        for name, gpu, at, value, peak in rows:
            s = out[(name, gpu)]
            s.points.append((float(at), float(value)))
            s.max.append(float(peak))
        return sorted(out.values(), key=lambda s: (s.name, -1 if s.gpu is None else s.gpu))

    def latest(self, *, node: str | None = None, job_id: int | None = None) -> Latest | None:
        """The newest sample batch of a node (its own values) or of a job; None if none."""
        c = t.system_metrics.c
        cond = self._where(node, job_id, None, None, None)
        # the newest time of a name every sample has, found through an index
        key = CPU_PERCENT if job_id is None else PROCESSES
        with self.db.connect() as conn:
            at = conn.execute(select(func.max(c.at)).where(*cond, c.name == key)).scalar()
            if at is None:
                return None
            rows = conn.execute(
                select(c.name, c.value, c.gpu, c.job_id).where(*cond, c.at == at)
            ).all()
        return Latest(float(at), tuple(Sample(n, float(v), g, j) for n, v, g, j in rows))

    def purge(self, before: float, *, batch: int = PURGE_BATCH) -> int:
        """Delete samples older than ``before``, ``batch`` rows per transaction."""
        c = t.system_metrics.c
        deleted = 0
        while True:
            with self.db.transaction() as conn:
                ids = select(c.id).where(c.at < before).limit(batch)
                n = conn.execute(delete(t.system_metrics).where(c.id.in_(ids))).rowcount
            deleted += n
            if n < batch:
                return deleted

    # -- counts for the Prometheus exposition ----------------------------------------------
    def jobs_by_state(self) -> dict[str, int]:
        j = t.jobs.c
        with self.db.connect() as conn:
            rows = conn.execute(select(j.state, func.count()).group_by(j.state)).all()
        counts = {s.value: 0 for s in JobState}
        counts.update({state: int(n) for state, n in rows})
        return counts

    def queued_by_priority(self) -> dict[str, int]:
        j = t.jobs.c
        with self.db.connect() as conn:
            rows = conn.execute(
                select(j.priority, func.count())
                .where(j.state == JobState.QUEUED.value)
                .group_by(j.priority)
            ).all()
        return {priority: int(n) for priority, n in rows}
