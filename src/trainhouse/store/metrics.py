"""Metric points: report parsing and batched ingest at the database's pace.

Ingest makes no Python object per point beyond what the JSON parser made: the SDK sends a
batch as five arrays (``"columns"``; an array per point, ``"points"``, is accepted too), each
column is checked with C-level builtins (``set(map(type, ...))``, ``min``, ``max``, names and
ranks on their distinct values) and the rows go to SQLite as multi-row upserts grouped by
series, or to PostgreSQL through ``COPY``, in one transaction with the batch-id record, the
resume cleanup and the job's progress. A point that breaks a rule is then looked for one by
one, so that the error names it (``points[17]: step must be ...``).

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
import math
import operator
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Connection, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from trainhouse.errors import InvalidMetrics
from trainhouse.store import rollup
from trainhouse.store import tables as t
from trainhouse.store.records import MetricPoint

INT64 = 2**63 - 1
INT32 = 2**31 - 1  # an attempt number (an INTEGER column)
MAX_RANK = 1_000_000
MAX_NAME = 256
MAX_REPORT_POINTS = 200_000
MAX_BATCH_ID = 64
COPY_FROM = 2_000  # PostgreSQL: batches this large go through COPY

_NONE = type(None)
_NUMBER = {float, int}


@dataclass(frozen=True)
class Columns:
    """Points as parallel columns (rank None: the job's own value)."""

    steps: Sequence[int]
    names: Sequence[str]
    values: Sequence[float | None]
    ranks: Sequence[int | None]
    walls: Sequence[float]
    attempts: int | Sequence[int] = 0

    def __len__(self) -> int:
        return len(self.steps)


EMPTY = Columns((), (), (), (), ())


@dataclass(frozen=True)
class Report:
    """One flush of the SDK's buffer: points plus a heartbeat."""

    batch_id: str
    attempt: int
    columns: Columns
    total_steps: int | None = None
    resume_step: int | None = None


# -- parsing and checking --------------------------------------------------------------------
def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _int_in(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _field_int(
    body: dict[str, Any], key: str, low: int, *, optional: bool, high: int = INT64
) -> int | None:
    value = body.get(key)
    if value is None:
        if optional:
            return None
        raise InvalidMetrics(f"{key}: required, an integer >= {low}")
    if not _int_in(value, low, high):
        raise InvalidMetrics(f"{key}: must be an integer from {low} to {high}, got {_show(value)}")
    return int(value)


def parse_report(body: bytes | str | dict[str, Any]) -> Report:
    """A report body checked; :class:`InvalidMetrics` names what is wrong.

    JSON ``{"batch_id", "attempt", "total_steps", "resume_step"}`` with the points either as
    ``"columns": {"step": [...], "name": [...], "value": [...], "rank": [...],
    "wall_time": [...]}`` (what the SDK sends: five lists, no JSON array per point to build,
    track and collect) or as ``"points": [[step, name, value, rank, wall_time], ...]``.
    """
    if not isinstance(body, dict):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidMetrics(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidMetrics("the request body must be a JSON object")
    batch_id = body.get("batch_id")
    if not isinstance(batch_id, str) or not 1 <= len(batch_id) <= MAX_BATCH_ID:
        raise InvalidMetrics(
            f"batch_id: must be a string of 1 to {MAX_BATCH_ID} characters, got {_show(batch_id)}"
        )
    if "\x00" in batch_id:  # PostgreSQL stores none
        raise InvalidMetrics(f"batch_id: must not contain a NUL character, got {_show(batch_id)}")
    attempt = _field_int(body, "attempt", 1, optional=False, high=INT32)
    assert attempt is not None
    total_steps = _field_int(body, "total_steps", 0, optional=True)
    resume_step = _field_int(body, "resume_step", -1, optional=True)
    if body.get("columns") is not None:
        columns = columns_from_dict(body["columns"], attempt)
    else:
        columns = columns_from_rows(body.get("points"), attempt)
    return Report(batch_id, attempt, columns, total_steps, resume_step)


COLUMN_KEYS = ("step", "name", "value", "rank", "wall_time")


def columns_from_dict(data: Any, attempt: int = 0) -> Columns:
    """``{"step": [...], "name": [...], "value": [...], "rank": [...], "wall_time": [...]}``
    checked and turned into columns."""
    if not isinstance(data, dict):
        raise InvalidMetrics(
            f"columns: must be an object of lists {', '.join(COLUMN_KEYS)}, got {_show(data)}"
        )
    lists = []
    for key in COLUMN_KEYS:
        column = data.get(key)
        if not isinstance(column, list):
            raise InvalidMetrics(f"columns.{key}: must be a list, got {_show(column)}")
        lists.append(column)
    lengths = [len(c) for c in lists]
    if len(set(lengths)) != 1:
        shown = ", ".join(f"{k} {n}" for k, n in zip(COLUMN_KEYS, lengths, strict=True))
        raise InvalidMetrics(f"columns: the lists must have the same length, got {shown}")
    if lengths[0] > MAX_REPORT_POINTS:
        raise InvalidMetrics(
            f"columns: at most {MAX_REPORT_POINTS} points per report, got {lengths[0]}"
        )
    steps, names, values, ranks, walls = lists
    return check_columns(Columns(steps, names, values, ranks, walls, attempt), "point")


def columns_from_rows(rows: Any, attempt: int = 0) -> Columns:
    """``[[step, name, value, rank, wall_time], ...]`` checked and turned into columns."""
    if rows is None:
        rows = []
    if not isinstance(rows, list):
        raise InvalidMetrics(
            f"points: must be a list of [step, name, value, rank, wall_time], got {_show(rows)}"
        )
    if len(rows) > MAX_REPORT_POINTS:
        raise InvalidMetrics(
            f"points: at most {MAX_REPORT_POINTS} points per report, got {len(rows)}"
        )
    if not rows:
        return Columns((), (), (), (), (), attempt)
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {5}:
        for i, row in enumerate(rows):
            if type(row) is not list or len(row) != 5:
                raise InvalidMetrics(
                    f"points[{i}]: must be [step, name, value, rank, wall_time], got {_show(row)}"
                )
    steps, names, values, ranks, walls = zip(*rows, strict=True)
    return check_columns(Columns(steps, names, values, ranks, walls, attempt), "points")


def _bad(columns: Columns, i: int) -> str | None:
    """Why point ``i`` is invalid (None: it is fine)."""
    step, name, value = columns.steps[i], columns.names[i], columns.values[i]
    rank, wall = columns.ranks[i], columns.walls[i]
    if not _int_in(step, 0, INT64):
        return f"step must be an integer from 0 to {INT64}, got {_show(step)}"
    if type(name) is not str or not 1 <= len(name) <= MAX_NAME or "\x00" in name:
        got = f"{len(name)} characters" if type(name) is str else _show(name)
        return f"name must be a string of 1 to {MAX_NAME} characters without NUL, got {got}"
    if value is not None and type(value) not in _NUMBER:
        return f"value must be a number or null, got {_show(value)}"
    if rank is not None and not _int_in(rank, 0, MAX_RANK):
        return f"rank must be null (the job's value) or an integer from 0 to {MAX_RANK}, got " + (
            _show(rank)
        )
    if type(wall) not in _NUMBER or not math.isfinite(wall):
        return f"wall_time must be a finite number (unix time), got {_show(wall)}"
    return None


def _first_bad(columns: Columns, label: str) -> InvalidMetrics:
    for i in range(len(columns)):
        reason = _bad(columns, i)
        if reason:
            return InvalidMetrics(f"{label}[{i}]: {reason}")
    raise AssertionError("a column check failed but no point breaks a rule")  # pragma: no cover


def check_columns(columns: Columns, label: str = "points") -> Columns:
    """Check every point at C speed; non-finite values become None, int values floats and a
    zero wall time now. Raises :class:`InvalidMetrics` naming the first bad point
    (``label[i]``)."""
    steps, values, walls = columns.steps, columns.values, columns.walls
    if not steps:
        return columns
    value_types: set[type] = set()
    try:
        value_types = set(map(type, values))
        ok = (
            set(map(type, steps)) == {int}
            and min(steps) >= 0
            and max(steps) <= INT64
            and not any(map(_bad_name, set(columns.names)))
            and all(r is None or _int_in(r, 0, MAX_RANK) for r in set(columns.ranks))
            and value_types <= {float, int, _NONE}
            and set(map(type, walls)) <= _NUMBER
            and all(map(math.isfinite, walls))
        )
    except TypeError:  # an unhashable name or rank
        ok = False
    if not ok:
        raise _first_bad(columns, label)
    if int in value_types:
        try:
            values = [float(v) if type(v) is int else v for v in values]
        except OverflowError:
            raise InvalidMetrics("points: a value is too large for a float") from None
    finite = [v for v in values if v is not None] if _NONE in value_types else values
    if not all(map(math.isfinite, finite)):  # type: ignore[arg-type]
        values = [v if v is None or math.isfinite(v) else None for v in values]
    if 0 in walls:
        now = time.time()
        walls = [w or now for w in walls]
    return Columns(steps, columns.names, values, columns.ranks, walls, columns.attempts)


def _bad_name(name: Any) -> bool:
    return type(name) is not str or not 1 <= len(name) <= MAX_NAME or "\x00" in name


def columns_from_points(points: Sequence[MetricPoint]) -> Columns:
    if not points:
        return EMPTY
    return check_columns(
        Columns(
            [p.step for p in points],
            [p.name for p in points],
            [p.value for p in points],
            [p.rank for p in points],
            [p.wall_time for p in points],
            [p.attempt for p in points],
        )
    )


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
