"""Metric series: listing a job's series and reading one, downsampled from the rollup.

:func:`series` lists a job's series (name, rank) with their point counts and step ranges (from
the rollup's coarsest buckets; past ``after_step`` from the points); :func:`points` returns one
series, every point or at most ``max_points`` of them: the step range is cut into
``(max_points - 2) // 2`` buckets, and each bucket gives its point with the smallest and its
point with the largest value (ties: the earliest; a bucket of only NaN gives its first point),
plus the series' first and last points. Real points, never averages, so spikes and the global
extremes survive. The buckets are made of the rollup's (:mod:`trainhouse.store.rollup`): the
finest level with at most about 8 of them per output bucket, finer ones and raw points at the
edges of the range, so their bounds fall on the rollup's; a query reads a few thousand summary
rows and then the kept points by step, whatever the series' length.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.records import MetricPoint
from trainhouse.store import rollup

MIN_DOWNSAMPLED = 4  # the first, the last, the smallest and the largest value


@dataclass(frozen=True)
class SeriesInfo:
    name: str
    rank: int | None
    points: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class SeriesPoints:
    name: str
    rank: int | None
    total_points: int
    downsampled: bool
    points: list[tuple[int, float | None, float]]


_driver_sql = rollup.driver_sql


def _fetch(engine: Engine, sql: str, params: dict[str, Any]) -> list[Any]:
    """Rows as the driver's tuples: no SQLAlchemy row per point on a million-point read."""
    with engine.connect() as conn:
        cursor = conn.connection.cursor()
        try:
            cursor.execute(_driver_sql(engine.dialect.name, sql), params)
            return list(cursor.fetchall())
        finally:
            cursor.close()


def _rank_filter(rank: int | None, all_ranks: bool) -> tuple[str, dict[str, Any]]:
    if all_ranks:
        return "", {}
    return " AND rank = :rank", {"rank": -1 if rank is None else rank}


def series(
    engine: Engine,
    job_id: int,
    *,
    name: str | None = None,
    rank: int | None = None,
    all_ranks: bool = False,
    after_step: int | None = None,
) -> list[SeriesInfo]:
    """A job's series (ordered by name, then rank: the job's own first) and their counts."""
    where, params = _rank_filter(rank, all_ranks)
    params["job"] = job_id
    if name is not None:
        where += " AND name = :name"
        params["name"] = name
    if after_step is None:  # the rollup's coarsest level: a row per 65,536 steps
        params["level"] = rollup.COARSEST
        sql = (
            "SELECT name, rank, sum(count), min(first_step), max(last_step) FROM metric_buckets "
            f"WHERE job_id = :job AND level = :level{where} GROUP BY name, rank ORDER BY name, rank"
        )
        with engine.connect() as conn:
            return [
                SeriesInfo(n, None if r < 0 else r, int(c), int(lo), int(hi))
                for n, r, c, lo, hi in conn.execute(text(sql), params)
            ]
    after = ""
    if after_step is not None:
        after = " AND step > :after"
        params["after"] = after_step
    # the count scans the index; the first and last steps are one index lookup each
    ends = (
        "(SELECT {f}(step) FROM metrics AS m WHERE m.job_id = :job AND m.name = g.name "
        f"AND m.rank = g.rank{after})"
    )
    sql = (
        f"SELECT name, rank, n, {ends.format(f='min')}, {ends.format(f='max')} FROM ("
        f"SELECT name, rank, count(*) AS n FROM metrics WHERE job_id = :job{where}{after} "
        "GROUP BY name, rank) AS g ORDER BY name, rank"
    )
    with engine.connect() as conn:
        return [
            SeriesInfo(n, None if r < 0 else r, int(c), int(lo), int(hi))
            for n, r, c, lo, hi in conn.execute(text(sql), params)
        ]


_SERIES = "job_id = :job AND name = :name AND rank = :rank"
_ALL_POINTS = (
    f"SELECT step, value, wall_time FROM metrics WHERE {_SERIES} AND step BETWEEN :lo AND :hi "
    "ORDER BY step"
)


_PAGE = (
    f"SELECT step, value, wall_time FROM metrics WHERE {_SERIES} AND step > :after "
    "ORDER BY step LIMIT :limit"
)


def page(
    engine: Engine, job_id: int, info: SeriesInfo, *, after_step: int, limit: int
) -> list[tuple[int, float | None, float]]:
    """The first ``limit`` points of one series past ``after_step``, in step order."""
    params = {
        "job": job_id,
        "name": info.name,
        "rank": -1 if info.rank is None else info.rank,
        "after": after_step,
        "limit": limit,
    }
    return [tuple(row) for row in _fetch(engine, _PAGE, params)]


def points(
    engine: Engine,
    job_id: int,
    info: SeriesInfo,
    *,
    max_points: int = 0,
) -> SeriesPoints:
    """The points of one series in ``info``'s step range (``info`` from :func:`series`),
    every one, or at most ``max_points`` (>= 4) picked from the rollup: per step bucket the
    smallest and the largest value, plus the first and the last point."""
    lo, hi = info.first_step, info.last_step
    params: dict[str, Any] = {
        "job": job_id,
        "name": info.name,
        "rank": -1 if info.rank is None else info.rank,
        "lo": lo,
        "hi": hi,
    }
    downsample = 0 < max_points < info.points
    if not downsample:
        return SeriesPoints(
            info.name, info.rank, info.points, False, _fetch(engine, _ALL_POINTS, params)
        )
    if max_points < MIN_DOWNSAMPLED:
        raise InvalidMetrics(
            f"max_points must be 0 (every point) or at least {MIN_DOWNSAMPLED}, got {max_points}"
        )
    buckets = (max_points - 2) // 2  # two per bucket, plus the first and the last
    width = -(-(hi - lo + 1) // buckets)  # ceil
    dialect = engine.dialect.name
    with engine.connect() as conn:
        cursor = conn.connection.cursor()
        try:
            found = rollup.cells(
                cursor, dialect, job_id, info.name, params["rank"], lo, hi, 8 * buckets
            )
            if len(found) > buckets:  # bucket the summaries by step, as the points would be
                found = [
                    rollup.merge(group, k)
                    for k, group in itertools.groupby(found, key=lambda c: (c[2] - lo) // width)
                ]
            keep = {lo, hi}
            for c in found:
                keep.add(c[2] if c[5] is None else c[5])  # the smallest, or the first if no finite
                if c[7] is not None:
                    keep.add(c[7])
            # literal integers (no parameter limit); the unique index finds each, also on
            # PostgreSQL, which may scan the whole series for an IN list (stale statistics)
            steps = ", ".join(map(str, sorted(int(k) for k in keep)))
            if dialect == "sqlite":
                sql = (
                    f"SELECT step, value, wall_time FROM metrics WHERE {_SERIES} "
                    f"AND step IN ({steps}) ORDER BY step"
                )
            else:
                sql = (  # one index lookup per step whatever the statistics say (LIMIT: not a join)
                    f"SELECT m.step, m.value, m.wall_time FROM unnest(CAST(ARRAY[{steps}] AS "
                    "BIGINT[])) AS k(step) CROSS JOIN LATERAL (SELECT step, value, wall_time "
                    f"FROM metrics WHERE {_SERIES} AND step = k.step LIMIT 1) AS m ORDER BY m.step"
                )
            cursor.execute(
                _driver_sql(dialect, sql), {k: params[k] for k in ("job", "name", "rank")}
            )
            got = list(cursor.fetchall())
        finally:
            cursor.close()
    return SeriesPoints(info.name, info.rank, info.points, True, got)


def legacy_points(
    engine: Engine,
    job_id: int,
    *,
    name: str | None = None,
    rank: int | None = None,
    all_ranks: bool = False,
) -> list[MetricPoint]:
    """Every point as a :class:`MetricPoint` (for tests and small reads)."""
    where, params = _rank_filter(rank, all_ranks)
    params["job"] = job_id
    if name is not None:
        where += " AND name = :name"
        params["name"] = name
    sql = (
        "SELECT step, name, value, rank, attempt, wall_time FROM metrics "
        f"WHERE job_id = :job{where} ORDER BY name, rank, step"
    )
    with engine.connect() as conn:
        return [
            MetricPoint(s, n, v, None if r < 0 else r, a, w)
            for s, n, v, r, a, w in conn.execute(text(sql), params)
        ]


@dataclass(frozen=True)
class SeriesSummary:
    """One of a job's own series in numbers: its last point, its extremes (finite values;
    None if it has none) and the mean of the finite values among its last ``last`` points."""

    name: str
    last_step: int
    last_value: float | None
    min_value: float | None
    max_value: float | None
    tail_mean: float | None
    tail_count: int  # the finite values the mean is of (fewer than asked: a short series)


# the runs table's summary (kept at ingest: trainhouse.store.metrics) and, per series, the
# last points by the unique index, newest first
_TAIL = (
    "(SELECT {f} FROM (SELECT m.value AS v FROM metrics AS m WHERE m.job_id = s.job_id "
    "AND m.name = s.name AND m.rank = -1 ORDER BY m.step DESC LIMIT :last) AS tail)"
)
_SUMMARIES = (
    "SELECT s.name, s.last_step, s.last_value, s.min_value, s.max_value, "
    f"{_TAIL.format(f='avg(v)')}, {_TAIL.format(f='count(v)')} "
    "FROM metric_summaries AS s WHERE s.job_id = :job ORDER BY s.name"
)


def summaries(engine: Engine, job_id: int, *, last: int) -> list[SeriesSummary]:
    """The job's own series (rank None) summed up, by name; ``last``: the points averaged."""
    rows = _fetch(engine, _SUMMARIES, {"job": job_id, "last": last})
    return [
        SeriesSummary(
            name=n,
            last_step=int(step),
            last_value=_float(final),
            min_value=_float(lo),
            max_value=_float(hi),
            tail_mean=_float(mean),
            tail_count=int(count),
        )
        for n, step, final, lo, hi, mean, count in rows
    ]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def count(engine: Engine, job_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM metrics WHERE job_id = :job"), {"job": job_id}
            ).scalar_one()
        )
