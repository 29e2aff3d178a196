"""The metric rollup: ``metric_buckets``, a pyramid of per-bucket summaries of every series.

Per series (job, name, rank) and level (a bucket width of 16, 256, 4096 or 65536 steps; a
bucket is ``step // width``) one row per non-empty bucket: its point count, first and last
steps, and its smallest and largest finite values with their steps (ties: the earliest; NULL
when every value in the bucket is NULL, i.e. not finite).

:func:`refresh_many` recomputes the buckets that overlap a step range of each of many series,
in the caller's transaction and in a few statements whatever the number of series (the SDK's
batches are small and wide: a second's worth of steps of every series). Ingest calls it once per
batch with the step range the batch covered in each series (new and replaced values alike) and,
after a resume deletion, everything past the resume step. A series whose new steps all come
after its last one (a running job's next batch) gets its new buckets from the batch itself,
merged with its last bucket at each level (one read for all series, one upsert); any other is
recomputed from its points: level 16 from the ``metrics`` rows, each coarser level from the 16
finer buckets below it. :func:`refresh` does it for one series (the migration's backfill).
:func:`cells` covers a step range exactly with as few rows as it can (coarse buckets inside,
finer ones and raw points at the edges) for downsampling.
"""

from __future__ import annotations

import functools
import itertools
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
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
_INSERT = "INSERT INTO metric_buckets (job_id, name, rank, level, " + _COLUMNS + ") "


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


Series = tuple[str, int]  # (name, rank: -1 for the job's own values)
Points = tuple[Sequence[int], Sequence[float | None]]  # steps and their values
Row = tuple[Any, ...]  # a metric_buckets row without the job: (name, rank, level) + a Cell

# PostgreSQL: the advisory lock (this key and the job's id) that serialises the transactions
# that refresh one job's rollup
LOCK = 0x726F6C6C  # "roll"
# parameters per SQLite statement: the connection's limit (32766 since SQLite 3.32) up to
# SQLITE_VARIABLES, else 999, the smallest limit a build may have
SQLITE_VARIABLES = 32766


def _sqlite_variables(cursor: Any) -> int:
    try:
        limit = cursor.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    except (AttributeError, sqlite3.Error):  # Python before 3.11
        return 999
    return min(SQLITE_VARIABLES, int(limit))


_UPSERT = " ON CONFLICT (job_id, name, rank, level, bucket) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[1:]
)
_PG_UPSERT = (
    _INSERT
    + "SELECT %b::bigint, * FROM unnest(%b::text[], %b::integer[], %b::integer[], %b::bigint[], "
    "%b::bigint[], %b::bigint[], %b::bigint[], %b::double precision[], %b::bigint[], "
    "%b::double precision[], %b::bigint[])" + _UPSERT
)
_SQLITE_DELETE = (
    "DELETE FROM metric_buckets WHERE job_id = ? AND name = ? AND rank = ? AND level = ? "
    "AND bucket = ?"
)
_PG_DELETE = (
    "DELETE FROM metric_buckets b USING unnest(%b::text[], %b::integer[], %b::integer[], "
    "%b::bigint[]) AS k(name, rank, level, bucket) WHERE b.job_id = %b::bigint "
    "AND b.name = k.name AND b.rank = k.rank AND b.level = k.level AND b.bucket = k.bucket"
)


def _sqlite_upsert(rows: int) -> str:
    return _INSERT + "VALUES " + ", ".join(["(" + ", ".join(["?"] * 12) + ")"] * rows) + _UPSERT


# Reads of many series in one statement (_keyed): a table k of keys (columns with their
# PostgreSQL types), optionally another table, and the rows that each key names, found through
# the primary key or the unique index: (key columns, select list, other table, table, join
# condition with {p} for the job, order).
_Query = tuple[tuple[tuple[str, str], ...], str, str, str, str, str]
_BUCKET_COLUMNS = "k.i, b.level, b." + _COLUMNS.replace(", ", ", b.")
# the buckets a series' new steps from ``lo`` on may continue: at each level lo's bucket, at
# the coarsest also any later one (then the steps are not past the series' last)
_TAILS: _Query = (
    (("i", "integer"), ("name", "text"), ("rank", "integer"), ("lo", "bigint")),
    "SELECT " + _BUCKET_COLUMNS,
    "(VALUES "
    + ", ".join(f"({1 << b}, {b}, {INT64 >> b if b == BITS[-1] else 0})" for b in BITS)
    + ") AS l",
    "metric_buckets b",
    "b.job_id = {p} AND b.name = k.name AND b.rank = k.rank AND b.level = l.column1 "
    "AND b.bucket BETWEEN k.lo >> l.column2 AND (k.lo >> l.column2) + l.column3",
    "ORDER BY k.i, b.level, b.bucket",
)
# the buckets of a level in a step range: bucket a to z
_BUCKETS: _Query = (
    (
        ("i", "integer"),
        ("name", "text"),
        ("rank", "integer"),
        ("level", "integer"),
        ("a", "bigint"),
        ("z", "bigint"),
    ),
    "SELECT " + _BUCKET_COLUMNS,
    "",
    "metric_buckets b",
    "b.job_id = {p} AND b.name = k.name AND b.rank = k.rank AND b.level = k.level "
    "AND b.bucket BETWEEN k.a AND k.z",
    "ORDER BY k.i, b.level, b.bucket",
)
# the points of a series from step a to z
_POINTS: _Query = (
    (("i", "integer"), ("name", "text"), ("rank", "integer"), ("a", "bigint"), ("z", "bigint")),
    "SELECT k.i, m.step, m.value",
    "",
    "metrics m",
    "m.job_id = {p} AND m.name = k.name AND m.rank = k.rank AND m.step BETWEEN k.a AND k.z",
    "ORDER BY k.i, m.step",
)


def _keyed(
    cursor: Any, dialect: str, query: _Query, keys: Sequence[tuple[Any, ...]], job: int
) -> list[tuple[Any, ...]]:
    """The rows of ``query`` for ``keys``, ``k`` the outer loop so that each key is one index
    search whatever the planner's statistics. SQLite: ``k`` a VALUES list (``CROSS JOIN``
    keeps the tables in their order), one statement per :func:`_sqlite_variables` parameters.
    PostgreSQL: one statement, the same text for every batch: ``k`` the ``unnest`` of an
    array per column, passed in binary (text arrays take longer to make than the query to
    run), and the rows a ``LATERAL`` subquery (``OFFSET 0`` keeps it from being flattened into
    a join that the planner may make a scan of the job's rows)."""
    columns, select, other, table, where, order = query
    names = ", ".join(c for c, _ in columns)
    join = f"CROSS JOIN {other} " if other else ""
    if dialect != "sqlite":
        arrays = ", ".join(f"%b::{kind}[]" for _, kind in columns)
        alias = table.split()[-1]
        cursor.execute(
            f"{select} FROM unnest({arrays}) AS k({names}) {join}CROSS JOIN LATERAL (SELECT * "
            f"FROM {table} WHERE {where.format(p='%b::bigint')} OFFSET 0) AS {alias} {order}",
            [*(list(c) for c in zip(*keys, strict=True)), job],
        )
        return list(cursor.fetchall())
    row = "(" + ", ".join(["?"] * len(columns)) + ")"
    per = (_sqlite_variables(cursor) - 1) // len(columns)
    out: list[tuple[Any, ...]] = []
    for start in range(0, len(keys), per):
        chunk = keys[start : start + per]
        cursor.execute(
            f"WITH k({names}) AS (VALUES {', '.join([row] * len(chunk))}) {select} FROM k "
            f"{join}CROSS JOIN {table} WHERE {where.format(p='?')} {order}",
            [*itertools.chain.from_iterable(chunk), job],
        )
        out += cursor.fetchall()
    return out


def _buckets(
    cursor: Any, dialect: str, job: int, query: _Query, keys: Sequence[tuple[Any, ...]]
) -> dict[int, dict[int, list[Cell]]]:
    """Stored buckets by series: index -> level -> cells in bucket order."""
    out: dict[int, dict[int, list[Cell]]] = {}
    if keys:
        for row in _keyed(cursor, dialect, query, keys, job):
            out.setdefault(row[0], {}).setdefault(row[1], []).append(tuple(row[2:]))
    return out


def _coarser(cells: Iterable[Cell], shift: int) -> list[Cell]:
    """Cells in step order merged into the buckets ``shift`` bits coarser."""
    return [merge(group, k) for k, group in itertools.groupby(cells, key=lambda c: c[0] >> shift)]


def refresh(
    cursor: Any,
    dialect: str,
    job: int,
    name: str,
    rank: int,
    lo: int,
    hi: int,
    appended: Points | None = None,
) -> None:
    """:func:`refresh_many` for one series."""
    refresh_many(
        cursor,
        dialect,
        job,
        {(name, rank): (lo, hi)},
        {} if appended is None else {(name, rank): appended},
    )


def refresh_many(
    cursor: Any,
    dialect: str,
    job: int,
    ranges: Mapping[Series, tuple[int, int]],
    appended: Mapping[Series, Points] | None = None,
) -> None:
    """Recompute every bucket that overlaps steps ``lo..hi`` of each series (name, rank) ->
    (lo, hi) of ``ranges`` (a DB-API cursor in the caller's transaction; rank -1 for the job's
    own values), in a few statements whatever the number of series.

    ``appended``: for some series of ``ranges``, the steps (strictly increasing, ``lo`` to
    ``hi``) and values just stored, when nothing else changed in the series since its rollup
    was last refreshed. If every step is past the series' last rolled-up step (the common
    case: a running job's next batch) they make the series' new buckets at every level without
    reading the points back: each level's new cells, the first merged with the series' last
    bucket there when the new steps continue it. The other series (and those whose steps turn
    out not to be past the last rolled-up one) are recomputed from their points: level 16
    from the ``metrics`` rows of its buckets in the range, each coarser level from the finer
    buckets below it (those just computed, the stored ones at the range's edges); a bucket
    that no longer has a point is deleted.

    Statements, for any number of series: one read of the last buckets of the appended
    series, one upsert of the buckets that changed; for recomputed series one read of their
    points, one of the buckets around their ranges and one delete (on SQLite a read or write
    is one statement per :func:`_sqlite_variables` parameters). On PostgreSQL one more statement
    first takes the job's rollup lock (:data:`LOCK`) for the rest of the transaction: the
    buckets are read and written back merged, so two transactions refreshing one series at
    once (a resume beside another rank's batch) would otherwise each overwrite the other's
    update. On SQLite the transaction already holds the database's write lock."""
    if dialect != "sqlite":
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%b::integer, %b::integer)", [LOCK, job & 0x7FFFFFFF]
        )
    appended = appended or {}
    order = list(ranges)
    tails = [i for i, key in enumerate(order) if key in appended]
    redo = [i for i, key in enumerate(order) if key not in appended]
    stored = _buckets(
        cursor, dialect, job, _TAILS, [(i, *order[i], ranges[order[i]][0]) for i in tails]
    )
    upserts: list[Row] = []
    late: list[int] = []
    for i in tails:
        name, rank = order[i]
        lo = ranges[order[i]][0]
        have = stored.pop(i, {})
        if any(c[3] >= lo for c in have.get(COARSEST, ())):  # not past the last step
            late.append(i)
            continue
        steps, values = appended[order[i]]
        new = _raw_cells(steps, values, BITS[0])
        prev = BITS[0]
        for level, bits in zip(LEVELS, BITS, strict=True):
            if bits != prev:
                new = _coarser(new, bits - prev)
            head = (name, rank, level)
            last = have.get(level)
            if last:  # the new steps continue the series' last bucket (lo's)
                upserts.append(head + merge([last[0], new[0]], new[0][0]))
                upserts.extend(head + c for c in new[1:])
            else:
                upserts.extend(head + c for c in new)
            prev = bits
    redo += late
    deletes: list[Row] = []
    if redo:
        stored = _buckets(cursor, dialect, job, _BUCKETS, _around(order, ranges, redo))
        points = _points(cursor, dialect, job, order, ranges, redo)
        for i in redo:
            name, rank = order[i]
            lo, hi = ranges[order[i]]
            have = stored.get(i, {})
            steps, values = points.get(i, ((), ()))
            new = _raw_cells(steps, values, BITS[0]) if steps else []
            prev = BITS[0]
            for level, bits in zip(LEVELS, BITS, strict=True):
                if bits != prev:  # the finer level's new buckets and its stored ones around
                    finer = have.get(1 << prev, [])
                    a, z = lo >> prev, hi >> prev
                    new = _coarser(
                        itertools.chain(
                            [c for c in finer if c[0] < a], new, [c for c in finer if c[0] > z]
                        ),
                        bits - prev,
                    )
                a, z = lo >> bits, hi >> bits
                old = {c[0]: c for c in have.get(level, ()) if a <= c[0] <= z}
                head = (name, rank, level)
                for c in new:
                    if old.pop(c[0], None) != c:
                        upserts.append(head + c)
                deletes.extend((*head, k) for k in old)
                prev = bits
    if deletes:
        if dialect == "sqlite":
            cursor.executemany(_SQLITE_DELETE, [(job, *d) for d in deletes])
        else:
            cursor.execute(_PG_DELETE, [*(list(c) for c in zip(*deletes, strict=True)), job])
    if upserts:
        if dialect != "sqlite":
            cursor.execute(_PG_UPSERT, [job, *(list(c) for c in zip(*upserts, strict=True))])
            return
        per = _sqlite_variables(cursor) // 12  # multi-row: faster than executemany
        for start in range(0, len(upserts), per):
            chunk = upserts[start : start + per]
            cursor.execute(
                _sqlite_upsert(len(chunk)),
                list(itertools.chain.from_iterable((job, *u) for u in chunk)),
            )


def _around(
    order: Sequence[Series], ranges: Mapping[Series, tuple[int, int]], which: Iterable[int]
) -> list[tuple[Any, ...]]:
    """:data:`_BUCKETS` keys for recomputing series ``which`` (indices into ``order``): at
    each level but the coarsest the buckets under the next level's buckets over the range (the
    range's own and its edges'), at the coarsest the range's own."""
    keys: list[tuple[Any, ...]] = []
    for i in which:
        name, rank = order[i]
        lo, hi = ranges[order[i]]
        for bits, up in itertools.pairwise(BITS):
            shift = up - bits
            keys.append(
                (i, name, rank, 1 << bits, (lo >> up) << shift, (((hi >> up) + 1) << shift) - 1)
            )
        keys.append((i, name, rank, COARSEST, lo >> BITS[-1], hi >> BITS[-1]))
    return keys


def _points(
    cursor: Any,
    dialect: str,
    job: int,
    order: Sequence[Series],
    ranges: Mapping[Series, tuple[int, int]],
    which: Iterable[int],
) -> dict[int, Points]:
    """The stored points of the finest buckets over each range: index -> (steps, values)."""
    bits = BITS[0]
    keys = []
    for i in which:
        lo, hi = ranges[order[i]]
        keys.append(
            (i, *order[i], (lo >> bits) << bits, min(INT64, (((hi >> bits) + 1) << bits) - 1))
        )
    out: dict[int, Points] = {}
    rows = _keyed(cursor, dialect, _POINTS, keys, job)
    for i, group in itertools.groupby(rows, key=lambda r: r[0]):
        got = list(group)
        out[i] = ([r[1] for r in got], [r[2] for r in got])
    return out


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
