"""The metric rollup: ``metric_buckets``, a pyramid of per-bucket summaries of every series.

Per series (job, name, rank) and level (a bucket width of 16, 256, 4096 or 65536 steps; a
bucket is ``step // width``) one row per non-empty bucket: its point count, first and last
steps, and its smallest and largest finite values with their steps (ties: the earliest; NULL
when every value in the bucket is NULL, i.e. not finite).

:func:`refresh` recomputes the buckets that overlap a step range of a series, in the caller's
transaction: level 16 from the ``metrics`` rows, each coarser level from the 16 finer buckets
below it, so a batch costs about one read of its own rows. Ingest calls it for the step range
each batch covered per series (new and replaced values alike) and, after a resume deletion, for
everything past the resume step. :func:`cells` covers a step range exactly with as few rows as
it can (coarse buckets inside, finer ones and raw points at the edges) for downsampling.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from typing import Any

INT64 = 2**63 - 1
BITS = (4, 8, 12, 16)  # widths 16, 256, 4096, 65536
LEVELS = tuple(1 << b for b in BITS)
COARSEST = LEVELS[-1]

# a bucket summary: (bucket, count, first_step, last_step, min_value, min_step, max_value,
# max_step)
Cell = tuple[int, int, int, int, float | None, int | None, float | None, int | None]

_SERIES = "job_id = :job AND name = :name AND rank = :rank"
_COLUMNS = "bucket, count, first_step, last_step, min_value, min_step, max_value, max_step"
_INSERT = (
    "INSERT INTO metric_buckets (job_id, name, rank, level, "
    + _COLUMNS
    + ") VALUES ({})".format(", ".join(["{p}"] * 12))
)


_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@functools.cache
def driver_sql(dialect: str, sql: str) -> str:
    """``sql`` with ``:name`` parameters in the driver's own style (sqlite3 takes them)."""
    return sql if dialect == "sqlite" else _PARAM.sub(r"%(\1)s", sql)


_sql = driver_sql


def _raw_cells(steps: Sequence[int], values: Sequence[float | None], bits: int) -> list[Cell]:
    """Bucket summaries of points sorted by step."""
    out: list[Cell] = []
    i = 0
    for k, group in itertools.groupby([s >> bits for s in steps]):
        n = len(list(group))
        j = i + n
        vals = values[i:j]
        if None in vals:
            at = [x for x in range(i, j) if values[x] is not None]
            if at:
                fin = [values[x] for x in at]
                lo = min(fin)  # type: ignore[type-var]
                hi = max(fin)  # type: ignore[type-var]
                out.append(
                    (
                        k,
                        n,
                        steps[i],
                        steps[j - 1],
                        lo,
                        steps[at[fin.index(lo)]],
                        hi,
                        steps[at[fin.index(hi)]],
                    )
                )
            else:
                out.append((k, n, steps[i], steps[j - 1], None, None, None, None))
        else:
            lo = min(vals)  # type: ignore[type-var]
            hi = max(vals)  # type: ignore[type-var]
            out.append(
                (
                    k,
                    n,
                    steps[i],
                    steps[j - 1],
                    lo,
                    steps[i + vals.index(lo)],
                    hi,
                    steps[i + vals.index(hi)],
                )
            )
        i = j
    return out


def merge(cells: Iterable[Cell], key: int) -> Cell:
    """One summary of ``cells`` (in step order) under bucket ``key``."""
    count = 0
    first = last = 0
    lo: float | None = None
    hi: float | None = None
    lo_at: int | None = None
    hi_at: int | None = None
    for i, (_, n, f, la, mn, mns, mx, mxs) in enumerate(cells):
        count += n
        if i == 0:
            first = f
        last = la
        if mn is not None and (lo is None or mn < lo):
            lo, lo_at = mn, mns
        if mx is not None and (hi is None or mx > hi):
            hi, hi_at = mx, mxs
    return (key, count, first, last, lo, lo_at, hi, hi_at)


def refresh(
    cursor: Any,
    dialect: str,
    job: int,
    name: str,
    rank: int,
    lo: int,
    hi: int,
    appended: tuple[Sequence[int], Sequence[float | None]] | None = None,
) -> None:
    """Recompute every bucket of the series that overlaps steps ``lo..hi`` (a DB-API cursor
    in the caller's transaction; ``rank`` -1 for the job's own values).

    ``appended``: the steps (strictly increasing) and values just stored in ``lo..hi``, when
    nothing else changed in the series since its rollup was last refreshed; if every step is
    past the series' last rolled-up step they make the finest buckets without reading the
    points back (the common case: a running job's next batch)."""
    series = {"job": job, "name": name, "rank": rank}
    bits = BITS[0]
    cells: list[Cell] | None = None
    if appended is not None:
        cursor.execute(
            _sql(
                dialect,
                f"SELECT max(last_step) FROM metric_buckets WHERE {_SERIES} AND level = :level",
            ),
            {**series, "level": COARSEST},
        )
        (last,) = cursor.fetchone()
        if last is None or last < lo:
            cells = _raw_cells(appended[0], appended[1], bits)
            if last is not None and last >> bits == lo >> bits:  # its bucket goes on
                cursor.execute(
                    _sql(
                        dialect,
                        f"SELECT {_COLUMNS} FROM metric_buckets WHERE {_SERIES} "
                        "AND level = :level AND bucket = :k",
                    ),
                    {**series, "level": 1 << bits, "k": lo >> bits},
                )
                before = cursor.fetchone()
                if before is not None:
                    cells[0] = merge([tuple(before), cells[0]], cells[0][0])
    if cells is None:
        cursor.execute(
            _sql(
                dialect,
                f"SELECT step, value FROM metrics WHERE {_SERIES} AND step BETWEEN :a AND :b "
                "ORDER BY step",
            ),
            {
                **series,
                "a": (lo >> bits) << bits,
                "b": min(INT64, (((hi >> bits) + 1) << bits) - 1),
            },
        )
        rows = cursor.fetchall()
        cells = []
        if rows:
            steps, values = zip(*rows, strict=True)
            cells = _raw_cells(steps, values, bits)
    prev = bits
    for level, bits in zip(LEVELS, BITS, strict=True):
        if bits != BITS[0]:  # from the finer level's buckets just written
            cursor.execute(
                _sql(
                    dialect,
                    f"SELECT {_COLUMNS} FROM metric_buckets WHERE {_SERIES} AND level = :level "
                    "AND bucket BETWEEN :a AND :b ORDER BY bucket",
                ),
                {
                    **series,
                    "level": 1 << prev,
                    "a": (lo >> bits) << (bits - prev),
                    "b": (((hi >> bits) + 1) << (bits - prev)) - 1,
                },
            )
            shift = bits - prev
            cells = [
                merge(group, k)
                for k, group in itertools.groupby(cursor.fetchall(), key=lambda c: c[0] >> shift)
            ]
        cursor.execute(
            _sql(
                dialect,
                f"DELETE FROM metric_buckets WHERE {_SERIES} AND level = :level "
                "AND bucket BETWEEN :a AND :b",
            ),
            {**series, "level": level, "a": lo >> bits, "b": hi >> bits},
        )
        if cells:
            head = (job, name, rank, level)
            cursor.executemany(
                _INSERT.format(p="?" if dialect == "sqlite" else "%s"),
                [head + c for c in cells],
            )
        prev = bits


def series_of(cursor: Any, dialect: str, job: int) -> list[tuple[str, int]]:
    cursor.execute(
        _sql(
            dialect,
            "SELECT DISTINCT name, rank FROM metric_buckets WHERE job_id = :job AND level = :level",
        ),
        {"job": job, "level": COARSEST},
    )
    return [(str(n), int(r)) for n, r in cursor.fetchall()]


def cells(
    cursor: Any, dialect: str, job: int, name: str, rank: int, lo: int, hi: int, most: int
) -> list[Cell]:
    """Summaries covering steps ``lo..hi`` of a series exactly, in step order: buckets of the
    finest level with at most about ``most`` buckets in the range, finer buckets and single
    points (bucket = step) at the edges where the range does not fall on bucket bounds."""
    series = {"job": job, "name": name, "rank": rank}
    top = len(BITS) - 1
    for i, bits in enumerate(BITS):
        if (hi >> bits) - (lo >> bits) + 1 <= most:
            top = i
            break

    def cover(a: int, z: int, level: int) -> list[Cell]:
        if a > z:
            return []
        if level < 0:
            cursor.execute(
                _sql(
                    dialect,
                    f"SELECT step, value FROM metrics WHERE {_SERIES} "
                    "AND step BETWEEN :a AND :z ORDER BY step",
                ),
                {**series, "a": a, "z": z},
            )
            return [
                (s, 1, s, s, v, None if v is None else s, v, None if v is None else s)
                for s, v in cursor.fetchall()
            ]
        bits = BITS[level]
        k0 = -(-a >> bits)  # the first bucket that starts at or after a
        k1 = ((z + 1) >> bits) - 1  # the last that ends at or before z
        if k0 > k1:
            return cover(a, z, level - 1)
        cursor.execute(
            _sql(
                dialect,
                f"SELECT {_COLUMNS} FROM metric_buckets WHERE {_SERIES} AND level = :level "
                "AND bucket BETWEEN :a AND :z ORDER BY bucket",
            ),
            {**series, "level": 1 << bits, "a": k0, "z": k1},
        )
        middle = list(cursor.fetchall())
        return (
            cover(a, (k0 << bits) - 1, level - 1) + middle + cover((k1 + 1) << bits, z, level - 1)
        )

    return cover(lo, hi, top)
