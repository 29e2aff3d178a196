"""Metric reports: parsing and checking what the SDK sends, at C speed.

The SDK sends a batch as five arrays (``"columns"``; an array per point, ``"points"``, is
accepted too). Each column is checked with C-level builtins (``set(map(type, ...))``, ``min``,
``max``, names and ranks on their distinct values); a point that breaks a rule is then looked
for one by one, so that the error names it (``points[17]: step must be ...``). Non-finite
values become None. The bounds here are the documented input limits (docs/security.md).

Storing checked columns: :mod:`trainhouse.store.metrics`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.records import MetricPoint

INT64 = 2**63 - 1
INT32 = 2**31 - 1  # an attempt number (an INTEGER column)
MAX_RANK = 1_000_000
MAX_NAME = 256
MAX_REPORT_POINTS = 200_000
MAX_BATCH_ID = 64
#: metric series per job: distinct (name, rank) pairs, every one it ever reported
#: (trainhouse.store.metrics counts them in the transaction that stores a report)
MAX_SERIES = 10_000

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
