"""Metric points (``store.metrics``): batched ingest at the database's pace, and the reads.

Ingest makes no Python object per point beyond what the JSON parser made: a batch arrives as
checked columns (:mod:`trainhouse.core.reports`) and the rows go to SQLite as multi-row
upserts grouped by series, or to PostgreSQL through ``COPY``, in one transaction with the
batch-id record, the resume cleanup and the job's progress.

Semantics: a batch id seen before for the job is ignored (retries are stored once); a
(name, rank, step) logged again replaces the old value (also within one batch: the last wins);
``resume=(attempt, step)`` first drops the points earlier attempts logged after ``step``; a
value that is not finite is stored as NULL.

A job has at most :data:`~trainhouse.core.reports.MAX_SERIES` series, (name, rank) pairs:
every series a batch names is recorded once in ``metric_series`` (a series whose points a
resume dropped stays there), and a batch that takes the job past the cap is refused whole
(:class:`~trainhouse.core.errors.InvalidMetrics`, its id not recorded). The count is taken in the
batch's transaction, after the job's series lock on PostgreSQL (SQLite's write lock on
SQLite), so two reports at once cannot both pass it.

The job's row keeps its progress: ``last_step``, the batch's last step of the job's own values
(rank None; it moves back after a restart from an earlier checkpoint), and
``latest_metrics``, the latest value of each of the job's own series (the value at the series'
highest step in the last batch that named it).

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

import orjson
from sqlalchemy import Connection, delete

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.records import MetricPoint
from trainhouse.core.reports import INT64, MAX_SERIES, Columns, columns_from_points
from trainhouse.store import rollup
from trainhouse.store import series as reads
from trainhouse.store import tables as t
from trainhouse.store.series import SeriesInfo, SeriesPoints, SeriesSummary

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
# a report of fewer than COPY_FROM points: one statement, the columns as arrays in binary (the
# last of two points of one key wins, as through COPY; per-row executemany cost ~15 us a point)
_PG_INSERT = (
    "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
    "SELECT DISTINCT ON (name, rank, step) %b::bigint, attempt, coalesce(rank, -1), step, name, "
    "value, wall_time FROM unnest(%b::integer[], %b::integer[], %b::bigint[], %b::text[], "
    "%b::double precision[], %b::double precision[]) WITH ORDINALITY "
    "AS p(attempt, rank, step, name, value, wall_time, seq) ORDER BY name, rank, step, seq DESC"
    + _UPSERT
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
            attempts = columns.attempts
            cursor.execute(
                _PG_INSERT,
                [
                    job_id,
                    [attempts] * len(columns) if isinstance(attempts, int) else list(attempts),
                    list(columns.ranks),
                    list(columns.steps),
                    list(columns.names),
                    list(columns.values),
                    list(columns.walls),
                ],
            )
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
            # dropped now, not at the commit: a group commit stores more reports in this
            # transaction (trainhouse.ingest.groupcommit), and the next large one stages again
            cursor.execute("DROP TABLE trainhouse_metrics_in")
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


# PostgreSQL: the advisory lock (this key and the job's id) that serialises the counting of a
# job's series (SQLite: the transaction's write lock)
SERIES_LOCK = 0x73657269  # "seri"
_PG_REGISTER = (
    "INSERT INTO metric_series (job_id, name, rank) SELECT %s::bigint, * FROM "
    "unnest(%s::text[], %s::integer[]) ON CONFLICT DO NOTHING"
)
_SQLITE_REGISTER = "INSERT OR IGNORE INTO metric_series (job_id, name, rank) VALUES (?, ?, ?)"


def _register_series(
    cursor: Any, dialect: str, job_id: int, keys: list[Series], limit: int
) -> None:
    """Record the series ``keys`` (sorted) of a batch for the job; raise
    :class:`InvalidMetrics` if that takes the job past ``limit`` series.

    Series the job has already reported cost one index probe each and no count. When some are
    new, the job's series are counted once the transactions that added series before have
    committed (PostgreSQL: :data:`SERIES_LOCK`, held to the end of the transaction; SQLite: the
    write lock the insert took), so a concurrent report's new series are counted too.
    """
    if dialect == "sqlite":
        cursor.executemany(_SQLITE_REGISTER, [(job_id, n, r) for n, r in keys])
    else:
        cursor.execute(_PG_REGISTER, [job_id, [n for n, _ in keys], [r for _, r in keys]])
    new = max(0, cursor.rowcount)
    if not new:
        return
    param = "?" if dialect == "sqlite" else "%s"
    if dialect != "sqlite":
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s::integer, %s::integer)",
            [SERIES_LOCK, job_id & 0x7FFFFFFF],
        )
    cursor.execute(f"SELECT count(*) FROM metric_series WHERE job_id = {param}", [job_id])
    total = int(cursor.fetchone()[0])
    if total > limit:
        raise InvalidMetrics(
            f"a job may have at most {limit} metric series (distinct name and rank pairs, "
            f"every one it ever reported); job {job_id} has {total - new}, and this report "
            f"names {new} new ones: log fewer distinct names"
        )


def _progress(columns: Columns) -> tuple[int, dict[str, float | None]] | None:
    """The batch's last step of the job's own values (rank None), and the value of each of the
    job's own series at its highest step in the batch (of two at one step, the last logged)."""
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
    if all(map(operator.le, steps, itertools.islice(steps, 1, None))):  # in step order
        return steps[-1], dict(zip(names, values, strict=True))  # the last of each name
    at: dict[str, tuple[int, float | None]] = {}
    for s, n, v in zip(steps, names, values, strict=True):
        seen = at.get(n)
        if seen is None or s >= seen[0]:
            at[n] = (s, v)
    return max(steps), {n: v for n, (_, v) in at.items()}


# the statements of every report, in the driver's own SQL (SQLAlchemy's Core costs more per
# statement than the statement does for a batch of 100 points); :func:`rollup.driver_sql`
# turns ``:name`` into psycopg's ``%(name)s``
_NEW_BATCH = (
    "INSERT INTO report_batches (job_id, batch_id, at) VALUES (:job, :batch, :at) "
    "ON CONFLICT DO NOTHING RETURNING batch_id"
)
_LATEST = {
    "sqlite": "SELECT latest_metrics FROM jobs WHERE id = :job",
    # FOR NO KEY UPDATE, as the UPDATE below takes (a scheduler's transition waits, not fails)
    "postgresql": "SELECT latest_metrics FROM jobs WHERE id = :job FOR NO KEY UPDATE",
}
_JSON_PARAM = {"sqlite": ":{}", "postgresql": "CAST(:{} AS json)"}


def _json_in(dialect: str, value: Any) -> Any:
    """A JSON column's value as the driver returned it, parsed (psycopg parses json itself)."""
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def _progress_update(
    cursor: Any, dialect: str, job_id: int, progress: dict[str, Any], now: float
) -> None:
    """``UPDATE jobs`` with the columns of ``progress`` (``latest_metrics`` a dict)."""
    params: dict[str, Any] = {**progress, "updated_at": now, "job": job_id}
    sets = []
    for column in (*progress, "updated_at"):
        if column == "latest_metrics":
            params[column] = orjson.dumps(progress[column]).decode()
            sets.append(f"latest_metrics = {_JSON_PARAM[dialect].format(column)}")
        else:
            sets.append(f"{column} = :{column}")
    sql = f"UPDATE jobs SET {', '.join(sets)} WHERE id = :job"
    cursor.execute(rollup.driver_sql(dialect, sql), params)


def add(
    conn: Connection,
    dialect: str,
    job_id: int,
    columns: Columns,
    *,
    batch_id: str | None = None,
    total_steps: int | None = None,
    resume: tuple[int, int] | None = None,
    max_series: int = MAX_SERIES,
) -> int:
    """Store checked ``columns`` in the caller's transaction; returns the points written.
    Raises :class:`InvalidMetrics` if they would take the job past ``max_series`` series."""
    cursor = conn.connection.cursor()
    try:
        return _add(
            cursor, conn, dialect, job_id, columns, batch_id, total_steps, resume, max_series
        )
    finally:
        cursor.close()


def _add(
    cursor: Any,
    conn: Connection,
    dialect: str,
    job_id: int,
    columns: Columns,
    batch_id: str | None,
    total_steps: int | None,
    resume: tuple[int, int] | None,
    max_series: int,
) -> int:
    now = time.time()
    if batch_id is not None:
        # the transaction's first write: SQLite takes its write lock here, before any read
        cursor.execute(
            rollup.driver_sql(dialect, _NEW_BATCH), {"job": job_id, "batch": batch_id, "at": now}
        )
        if cursor.fetchone() is None:  # seen before: a retry
            return 0
    ranks = _series_ranks(columns) if len(columns) else None
    if len(columns):
        keys = sorted(
            {(n, -1) for n in set(columns.names)}
            if ranks is None
            else set(zip(columns.names, ranks, strict=True))
        )
        _register_series(cursor, dialect, job_id, keys, max_series)
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
            for key in rollup.series_of(cursor, dialect, job_id):
                touched[key] = (step + 1, INT64)
    fresh: dict[Series, tuple[Sequence[int], Sequence[float | None]]] = {}
    if len(columns):
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
        rollup.refresh_many(cursor, dialect, job_id, touched, fresh)
        own = sorted({name for name, rank in touched if rank == -1})
        if own:
            _summarize(cursor, dialect, job_id, own, vanished=resume is not None)
    progress: dict[str, Any] = {}
    found = _progress(columns)
    if found is not None:
        last, latest = found
        cursor.execute(rollup.driver_sql(dialect, _LATEST[dialect]), {"job": job_id})
        current = cursor.fetchone()
        if current is not None:  # (the last step moves back after a restart)
            progress.update(
                last_step=last,
                latest_metrics={**(_json_in(dialect, current[0]) or {}), **latest},
            )
    if total_steps is not None:
        progress["total_steps"] = total_steps
    if progress:
        _progress_update(cursor, dialect, job_id, progress, now)
    return len(columns)


# the summary of the job's own series (metric_summaries, the runs table's columns): last step
# and extremes from the rollup's coarsest buckets (just refreshed), the last value from the
# point at the last step; one statement for the batch's series
_SUMMARIZE = (
    "INSERT INTO metric_summaries (job_id, name, last_step, last_value, min_value, max_value) "
    "SELECT g.job_id, g.name, g.last_step, (SELECT m.value FROM metrics m "
    "WHERE m.job_id = g.job_id AND m.name = g.name AND m.rank = -1 AND m.step = g.last_step), "
    "g.lo, g.hi FROM (SELECT job_id, name, max(last_step) AS last_step, min(min_value) AS lo, "
    "max(max_value) AS hi FROM metric_buckets WHERE job_id = {p} AND rank = -1 AND level = {p} "
    "AND name {names} GROUP BY job_id, name) AS g WHERE true "
    "ON CONFLICT (job_id, name) DO UPDATE SET last_step = excluded.last_step, "
    "last_value = excluded.last_value, min_value = excluded.min_value, "
    "max_value = excluded.max_value"
)
# after a resume dropped points: a series left with none has no summary either
_UNSUMMARIZE = (
    "DELETE FROM metric_summaries WHERE job_id = {p} AND name {names} AND NOT EXISTS "
    "(SELECT 1 FROM metric_buckets b WHERE b.job_id = metric_summaries.job_id "
    "AND b.name = metric_summaries.name AND b.rank = -1 AND b.level = {p})"
)


def _summarize(cursor: Any, dialect: str, job_id: int, names: list[str], vanished: bool) -> None:
    """Refresh the summaries of the job's own series ``names`` from their rollup."""
    statements = [_SUMMARIZE] + ([_UNSUMMARIZE] if vanished else [])
    if dialect != "sqlite":
        for sql in statements:
            cursor.execute(
                sql.format(p="%s", names="= ANY(%s)"),
                [job_id, rollup.COARSEST, names]
                if sql is _SUMMARIZE
                else [job_id, names, rollup.COARSEST],
            )
        return
    per = SQLITE_VARIABLES - 2
    for start in range(0, len(names), per):
        chunk = names[start : start + per]
        marks = "IN (" + ", ".join("?" * len(chunk)) + ")"
        for sql in statements:
            params = (
                [job_id, rollup.COARSEST, *chunk]
                if sql is _SUMMARIZE
                else [job_id, *chunk, rollup.COARSEST]
            )
            cursor.execute(sql.format(p="?", names=marks), params)


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

        ``points``: MetricPoints, or :class:`~trainhouse.core.reports.Columns` checked by
        ``reports.check_columns`` (the report route's fast path).
        A ``batch_id`` already seen for this job is ignored, so a client may retry a batch.
        ``resume=(attempt, step)``: that attempt resumed after ``step``, so points earlier
        attempts logged past it are dropped first (the series is the final lineage).
        Raises :class:`~trainhouse.core.errors.InvalidMetrics`, storing nothing, if the points would
        take the job past :data:`~trainhouse.core.reports.MAX_SERIES` series.
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

    def page(
        self, job_id: int, info: SeriesInfo, *, after_step: int, limit: int
    ) -> list[tuple[int, float | None, float]]:
        """The first ``limit`` points of one series past ``after_step`` (step, value, wall
        time), in step order: every point, a page at a time."""
        return reads.page(self.db.engine, job_id, info, after_step=after_step, limit=limit)

    def summaries(self, job_id: int, *, last: int) -> list[SeriesSummary]:
        """The job's own series in numbers (last point, extremes, the mean of the last
        ``last`` points), by name."""
        return reads.summaries(self.db.engine, job_id, last=last)

    def count(self, job_id: int) -> int:
        return reads.count(self.db.engine, job_id)
