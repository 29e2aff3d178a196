"""Metric series: listing a job's series and reading one, downsampled in SQL.

:func:`series` lists a job's series (name, rank) with their point counts and step ranges;
:func:`points` returns one series, every point or at most ``max_points`` of them: the step range
is cut into ``(max_points - 2) // 2`` buckets, and each bucket gives its point with the smallest
and its point with the largest value (ties: the earliest; a bucket of only NaN gives its first
point), plus the series' first and last points. Real points, never averages, so spikes and the
global extremes survive. Both read every value of the series once per extreme (two passes
through the unique index and the table), which is what bounds their time on a long series.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from trainhouse.store.metrics import InvalidMetrics
from trainhouse.store.records import MetricPoint

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


_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@functools.cache
def _driver_sql(dialect: str, sql: str) -> str:
    """``sql`` with ``:name`` parameters in the driver's own style (sqlite3 takes them)."""
    return sql if dialect == "sqlite" else _PARAM.sub(r"%(\1)s", sql)


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
# Step buckets [a, z] of width :w from :lo to :hi (computed without overflowing BIGINT); per
# bucket the point with the smallest value and the one with the largest (ties: the earliest),
# or the bucket's first point where every value is NULL (not finite).
_DOWNSAMPLE = f"""
WITH RECURSIVE bk(a, z) AS (
    SELECT CAST(:lo AS BIGINT), CASE WHEN :lo > :hi - :w THEN CAST(:hi AS BIGINT)
                                     ELSE CAST(:lo AS BIGINT) + :w - 1 END
    UNION ALL
    SELECT z + 1, CASE WHEN z + 1 > :hi - :w THEN CAST(:hi AS BIGINT) ELSE z + :w END
    FROM bk WHERE z < :hi
), picked AS (
    SELECT
        COALESCE(
            (SELECT step FROM metrics WHERE {_SERIES} AND step BETWEEN bk.a AND bk.z
             AND value IS NOT NULL ORDER BY value ASC, step ASC LIMIT 1),
            (SELECT min(step) FROM metrics WHERE {_SERIES} AND step BETWEEN bk.a AND bk.z)
        ) AS low,
        (SELECT step FROM metrics WHERE {_SERIES} AND step BETWEEN bk.a AND bk.z
         AND value IS NOT NULL ORDER BY value DESC, step ASC LIMIT 1) AS high
    FROM bk
)
SELECT step, value, wall_time FROM metrics WHERE {_SERIES} AND step IN (
    SELECT low FROM picked UNION SELECT high FROM picked
    UNION SELECT CAST(:lo AS BIGINT) UNION SELECT CAST(:hi AS BIGINT)
) ORDER BY step
"""


def points(
    engine: Engine,
    job_id: int,
    info: SeriesInfo,
    *,
    max_points: int = 0,
) -> SeriesPoints:
    """The points of one series in ``info``'s step range (``info`` from :func:`series`),
    every one, or at most ``max_points`` (>= 4) picked in SQL: per step bucket the smallest and
    the largest value, plus the first and the last point."""
    lo, hi = info.first_step, info.last_step
    params: dict[str, Any] = {
        "job": job_id,
        "name": info.name,
        "rank": -1 if info.rank is None else info.rank,
        "lo": lo,
        "hi": hi,
    }
    downsample = 0 < max_points < info.points
    if downsample:
        if max_points < MIN_DOWNSAMPLED:
            raise InvalidMetrics(
                f"max_points must be 0 (every point) or at least {MIN_DOWNSAMPLED}, "
                f"got {max_points}"
            )
        buckets = (max_points - 2) // 2  # two per bucket, plus the first and the last
        params["w"] = -(-(hi - lo + 1) // buckets)  # ceil
        sql = _DOWNSAMPLE
    else:
        sql = _ALL_POINTS
    return SeriesPoints(info.name, info.rank, info.points, downsample, _fetch(engine, sql, params))


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


def count(engine: Engine, job_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM metrics WHERE job_id = :job"), {"job": job_id}
            ).scalar_one()
        )
