"""Metric points (``store.metrics``): batched ingest at the database's pace, and the reads.

Ingest makes no Python object per point beyond what the JSON parser made: a batch arrives as
checked columns (:mod:`trainhouse.store.reports`) and the rows go to SQLite as multi-row
upserts grouped by series, or to PostgreSQL through ``COPY``, in one transaction with the
batch-id record, the resume cleanup and the job's progress.

Semantics: a batch id seen before for the job is ignored (retries are stored once); a
(name, rank, step) logged again replaces the old value (also within one batch: the last wins);
``resume=(attempt, step)`` first drops the points earlier attempts logged after ``step``; a
value that is not finite is stored as NULL.

Every batch also recomputes, in its transaction, the rollup buckets
(:mod:`trainhouse.store.rollup`) over the step range it covered in each series it touched
(after a resume deletion: everything past the resume step), so a replaced or dropped value
never leaves a stale summary.

Reads and downsampling: :mod:`trainhouse.store.series`.
"""

from __future__ import annotations

import functools
import itertools
import operator
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from trainhouse.store import rollup
from trainhouse.store import series as reads
from trainhouse.store import tables as t
from trainhouse.store.records import MetricPoint
from trainhouse.store.reports import INT64, Columns, columns_from_points
from trainhouse.store.series import SeriesInfo, SeriesPoints

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["MetricRepo", "add"]

COPY_FROM = 2_000  # PostgreSQL: batches this large go through COPY


# -- ingest ----------------------------------------------------------------------------------
_UPSERT = (
    " ON CONFLICT (job_id, name, rank, step) DO UPDATE SET value = excluded.value, "
    "attempt = excluded.attempt, wall_time = excluded.wall_time"
)
_INSERT = "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) VALUES "
# parameters per SQLite INSERT of many rows: the smallest limit a build may have (before 3.32);
# ~200 rows per statement store a batch about a quarter faster than one row per statement
SQLITE_VARIABLES = 999
_PG_INSERT = (
    "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
    "VALUES (%s, %s, coalesce(%s::integer, -1), %s::bigint, %s, %s::double precision, "
    "%s::double precision)" + _UPSERT
)
_PG_STAGE = (
    "CREATE TEMPORARY TABLE trainhouse_metrics_in (seq BIGINT GENERATED ALWAYS AS IDENTITY, "
    "attempt INTEGER, rank INTEGER, step BIGINT, name TEXT, value DOUBLE PRECISION, "
    "wall_time DOUBLE PRECISION) ON COMMIT DROP"
)
_PG_FROM_STAGE = (
    "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
    "SELECT DISTINCT ON (name, rank, step) %s, attempt, rank, step, name, value, wall_time "
    "FROM trainhouse_metrics_in ORDER BY name, rank, step, seq DESC" + _UPSERT
)


def _attempt_column(columns: Columns) -> Iterable[int]:
    a = columns.attempts
    return itertools.repeat(a) if isinstance(a, int) else a


@functools.cache
def _sqlite_insert(row: str, rows: int) -> str:
    return _INSERT + ", ".join([row] * rows) + _UPSERT


def _series_order(names: Sequence[str], ranks: Sequence[int] | None) -> list[int] | None:
    """Indices of the points grouped by series (name, rank), each group in the order logged
    (stable sorts: of two points of one key, the last stays last); None: already one series."""
    order: list[int] | None = None
    if ranks is not None and len(set(ranks)) > 1:
        order = sorted(range(len(ranks)), key=ranks.__getitem__)
    if len(set(names)) > 1:
        order = sorted(order or range(len(names)), key=names.__getitem__)
    return order


def _insert_sqlite(cursor: Any, job_id: int, columns: Columns, order: list[int] | None) -> None:
    """Multi-row INSERTs of up to ``SQLITE_VARIABLES`` parameters, series by series.

    Rows go in grouped by series (the unique index's order): each statement then touches a few
    neighbouring index pages, which makes a batch of many series about twice as fast to store
    as the order the points were logged in (and keeps a series' rows together on disk). The
    job, the attempt and the job's rank (-1) are literals when the same for every row.
    """
    row = [str(int(job_id))]
    bound: list[Sequence[Any]] = []
    if isinstance(columns.attempts, int):
        row.append(str(int(columns.attempts)))
    else:
        row.append("?")
        bound.append(columns.attempts)
    ranks: list[int] | None = None
    if set(columns.ranks) == {None}:
        row.append("-1")
    else:
        row.append("?")
        ranks = [-1 if r is None else r for r in columns.ranks]
        bound.append(ranks)
    row += ["?"] * 4
    bound += [columns.steps, columns.names, columns.values, columns.walls]
    count = len(columns)
    if order is not None:
        take = operator.itemgetter(*order)
        bound = [take(c) for c in bound]
    template = "(" + ", ".join(row) + ")"
    width = len(bound)
    per = SQLITE_VARIABLES // width
    full = count - count % per
    if full:
        sql = _sqlite_insert(template, per)
        flat = list(itertools.chain.from_iterable(zip(*bound, strict=True)))
        chunk = per * width
        for start in range(0, full * width, chunk):
            cursor.execute(sql, flat[start : start + chunk])
    if full < count:
        rest = zip(*(c[full:] for c in bound), strict=True)
        cursor.executemany(_sqlite_insert(template, 1), rest)


def _insert_points(
    conn: Connection, dialect: str, job_id: int, columns: Columns, order: list[int] | None
) -> None:
    cursor = conn.connection.cursor()
    try:
        if dialect == "sqlite":
            _insert_sqlite(cursor, job_id, columns, order)
        elif len(columns) < COPY_FROM:
            rows = zip(
                itertools.repeat(job_id),
                _attempt_column(columns),
                columns.ranks,
                columns.steps,
                columns.names,
                columns.values,
                columns.walls,
            )
            cursor.executemany(_PG_INSERT, list(rows))
        else:  # COPY into a transaction's temporary table, then one upsert (last one wins)
            cursor.execute(_PG_STAGE)
            staged = zip(
                _attempt_column(columns),
                [-1 if r is None else r for r in columns.ranks],
                columns.steps,
                columns.names,
                columns.values,
                columns.walls,
                strict=False,  # the attempt column may be itertools.repeat(attempt)
            )
            with cursor.copy(
                "COPY trainhouse_metrics_in (attempt, rank, step, name, value, wall_time) "
                "FROM STDIN"
            ) as copy:
                for row in staged:
                    copy.write_row(row)
            cursor.execute(_PG_FROM_STAGE, (job_id,))
    finally:
        cursor.close()


Series = tuple[str, int]  # (name, rank: -1 for the job's own values)


def _series_ranks(columns: Columns) -> list[int] | None:
    """The rank column with -1 for None; None where every rank is None."""
    if set(columns.ranks) == {None}:
        return None
    return [-1 if r is None else r for r in columns.ranks]


def _by_series(
    columns: Columns, ranks: list[int] | None, order: list[int] | None
) -> dict[Series, tuple[Sequence[int], Sequence[float | None]]]:
    """Each series' steps and values in ``columns``, in the order logged (``order``: the
    points grouped by series, from :func:`_series_order`)."""
    steps, values, names = columns.steps, columns.values, columns.names
    if order is None:  # one series
        return {(names[0], -1 if ranks is None else ranks[0]): (steps, values)}
    take = operator.itemgetter(*order)
    steps, values, names = take(steps), take(values), take(names)
    keys: Iterable[Any] = names
    if ranks is not None:
        keys = zip(names, take(ranks), strict=True)
    out: dict[Series, tuple[Sequence[int], Sequence[float | None]]] = {}
    i = 0
    for key, group in itertools.groupby(keys):
        j = i + len(list(group))
        out[(key, -1) if ranks is None else key] = (steps[i:j], values[i:j])
        i = j
    return out


def _progress(columns: Columns) -> tuple[int, dict[str, float | None]] | None:
    """The batch's last step of the job's own values (rank None) and their values there."""
    steps, names, values = columns.steps, columns.names, columns.values
    rank_set = set(columns.ranks)
    if None not in rank_set:
        return None
    if rank_set != {None}:
        ranks = columns.ranks
        mine = [
            (s, n, v) for s, n, v, r in zip(steps, names, values, ranks, strict=True) if r is None
        ]
        steps, names, values = (list(c) for c in zip(*mine, strict=True))
    last = max(steps)
    return last, {n: v for s, n, v in zip(steps, names, values, strict=True) if s == last}


def add(
    conn: Connection,
    dialect: str,
    job_id: int,
    columns: Columns,
    *,
    batch_id: str | None = None,
    total_steps: int | None = None,
    resume: tuple[int, int] | None = None,
) -> int:
    """Store checked ``columns`` in the caller's transaction; returns the points written."""
    now = time.time()
    if batch_id is not None:
        # the transaction's first write: SQLite takes its write lock here, before any read
        ins = (pg_insert if dialect == "postgresql" else sqlite_insert)(t.report_batches)
        new = conn.execute(
            ins.values(job_id=job_id, batch_id=batch_id, at=now)
            .on_conflict_do_nothing()
            .returning(t.report_batches.c.batch_id)
        ).first()
        if new is None:  # seen before: a retry
            return 0
    touched: dict[tuple[str, int], tuple[int, int]] = {}  # series -> step range to roll up
    if resume is not None:
        attempt, step = resume
        dropped = conn.execute(
            delete(t.metrics).where(
                t.metrics.c.job_id == job_id,
                t.metrics.c.step > step,
                t.metrics.c.attempt < attempt,
            )
        ).rowcount
        if dropped:
            cursor = conn.connection.cursor()
            try:
                for key in rollup.series_of(cursor, dialect, job_id):
                    touched[key] = (step + 1, INT64)
            finally:
                cursor.close()
    fresh: dict[Series, tuple[Sequence[int], Sequence[float | None]]] = {}
    if len(columns):
        ranks = _series_ranks(columns)
        order = _series_order(columns.names, ranks) if len(columns) > 1 else None
        _insert_points(conn, dialect, job_id, columns, order)
        for key, (steps, values) in _by_series(columns, ranks, order).items():
            lo, hi = steps[0], steps[-1]
            if len(steps) > 1 and not all(map(operator.lt, steps, steps[1:])):
                lo, hi = min(steps), max(steps)  # out of order or logged twice: read back
            elif key not in touched:
                fresh[key] = (steps, values)
            was = touched.get(key)
            touched[key] = (lo, hi) if was is None else (min(lo, was[0]), max(hi, was[1]))
    if touched:
        cursor = conn.connection.cursor()
        try:
            rollup.refresh_many(cursor, dialect, job_id, touched, fresh)
        finally:
            cursor.close()
    progress: dict[str, Any] = {}
    found = _progress(columns)
    if found is not None:
        last, latest = found
        current = conn.execute(
            select(t.jobs.c.last_step, t.jobs.c.latest_metrics).where(t.jobs.c.id == job_id)
        ).first()
        if current is not None:
            if current[0] is not None and last == current[0]:
                progress["latest_metrics"] = {**(current[1] or {}), **latest}
            else:  # a later step, or an earlier one after a restart from a checkpoint
                progress.update(last_step=last, latest_metrics=latest)
    if total_steps is not None:
        progress["total_steps"] = total_steps
    if progress:
        progress["updated_at"] = now
        conn.execute(update(t.jobs).where(t.jobs.c.id == job_id).values(**progress))
    return len(columns)


class MetricRepo:
    """A job's metric series: ingest, and reads (:mod:`trainhouse.store.series`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(
        self,
        job_id: int,
        points: Sequence[MetricPoint] | Columns,
        *,
        batch_id: str | None = None,
        total_steps: int | None = None,
        resume: tuple[int, int] | None = None,
    ) -> int:
        """Store points; a (name, rank, step) seen before is replaced. Returns points written.

        ``points``: MetricPoints, or :class:`~trainhouse.store.reports.Columns` checked by
        ``reports.check_columns`` (the report route's fast path).
        A ``batch_id`` already seen for this job is ignored, so a client may retry a batch.
        ``resume=(attempt, step)``: that attempt resumed after ``step``, so points earlier
        attempts logged past it are dropped first (the series is the final lineage).
        """
        columns = points if isinstance(points, Columns) else columns_from_points(points)
        with self.db.transaction() as conn:
            return add(
                conn,
                self.db.dialect,
                job_id,
                columns,
                batch_id=batch_id,
                total_steps=total_steps,
                resume=resume,
            )

    def points(
        self,
        job_id: int,
        *,
        name: str | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
    ) -> list[MetricPoint]:
        """Every point (ordered by name, rank, step); large reads use :meth:`series_points`."""
        return reads.legacy_points(
            self.db.engine, job_id, name=name, rank=rank, all_ranks=all_ranks
        )

    def series(
        self,
        job_id: int,
        *,
        name: str | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
        after_step: int | None = None,
    ) -> list[SeriesInfo]:
        """The job's series with their point counts and step ranges (past ``after_step``)."""
        return reads.series(
            self.db.engine,
            job_id,
            name=name,
            rank=rank,
            all_ranks=all_ranks,
            after_step=after_step,
        )

    def series_points(self, job_id: int, info: SeriesInfo, *, max_points: int = 0) -> SeriesPoints:
        """One series' points in ``info``'s step range; at most ``max_points`` (0: all),
        downsampled in SQL keeping each step bucket's extremes and the first and last points."""
        return reads.points(self.db.engine, job_id, info, max_points=max_points)

    def count(self, job_id: int) -> int:
        return reads.count(self.db.engine, job_id)
