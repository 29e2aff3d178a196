"""The metric fast path (trainhouse.store.metrics) on SQLite and PostgreSQL: ingest semantics,
report parsing, series listing and server-side downsampling."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from tests.support.records import new_job as make_job
from trainhouse.core import reports as m
from trainhouse.core.reports import Columns, parse_report
from trainhouse.errors import InvalidMetrics
from trainhouse.ingest.spool import ingest_spool
from trainhouse.jobfs.layout import AttemptLayout
from trainhouse.store import MetricPoint, Store
from trainhouse.store.series import SeriesInfo, SeriesPoints

INT64 = 2**63 - 1


def new_job(store: Store) -> int:
    return make_job(store)


def cols(
    steps: list[int],
    name: str | list[str] = "loss",
    values: list[float | None] | None = None,
    ranks: list[int | None] | None = None,
    attempt: int = 1,
) -> Columns:
    n = len(steps)
    names = [name] * n if isinstance(name, str) else name
    vals = values if values is not None else [float(s) for s in steps]
    return m.check_columns(Columns(steps, names, vals, ranks or [None] * n, [1.0] * n, attempt))


def series(store: Store, job_id: int, name: str = "loss", rank: int | None = None) -> list:
    return [
        (p.step, p.value, p.attempt) for p in store.metrics.points(job_id, name=name, rank=rank)
    ]


# -- ingest semantics, both databases ---------------------------------------------------------
def test_a_retried_batch_is_stored_once(store: Store) -> None:
    job = new_job(store)
    batch = cols(list(range(3000)))  # past PostgreSQL's COPY threshold
    assert store.metrics.add(job, batch, batch_id="b1") == 3000
    assert store.metrics.add(job, batch, batch_id="b1") == 0
    assert store.metrics.add(job, cols([5], values=[99.0]), batch_id="b1") == 0  # still a retry
    assert store.metrics.count(job) == 3000
    assert series(store, job)[5] == (5, 5.0, 1)


@pytest.mark.parametrize("size", [10, 997, 5000])  # one statement, many, and COPY on PostgreSQL
def test_the_last_value_of_a_key_wins_within_a_batch_and_across_batches(
    store: Store, size: int
) -> None:
    job = new_job(store)
    steps = list(range(size))
    # every step twice in one batch, interleaved with another series: the second one wins
    names = ["loss", "acc"] * size + ["loss"] * size
    batch_steps = [s for s in steps for _ in (0, 1)] + steps
    values = [float(i) for i in range(len(batch_steps))]
    store.metrics.add(job, cols(batch_steps, names, values))
    loss = series(store, job)
    assert [p[0] for p in loss] == steps
    assert [p[1] for p in loss] == [float(2 * size + s) for s in steps]
    assert [p[1] for p in series(store, job, "acc")] == [float(2 * s + 1) for s in steps]
    # a later batch (a restart that logs steps again) replaces them
    store.metrics.add(job, cols(steps[:3], values=[-1.0, -2.0, -3.0], attempt=2))
    loss = series(store, job)
    assert loss[:4] == [(0, -1.0, 2), (1, -2.0, 2), (2, -3.0, 2), (3, 2 * size + 3.0, 1)]


def test_a_shuffled_batch_of_many_series_and_ranks_is_stored_exactly(store: Store) -> None:
    """Whatever order points come in (the store groups them by series), a key's last wins."""
    job = new_job(store)
    rng = random.Random(3)
    keys = [(f"m{i}", r, s) for i in range(20) for r in (None, 0, 7) for s in range(60)]
    keys += rng.choices(keys, k=1500)  # logged again later in the same batch
    rng.shuffle(keys)
    values = [float(i) for i in range(len(keys))]
    expected = {k: v for k, v in zip(keys, values, strict=True)}
    batch = cols([k[2] for k in keys], [k[0] for k in keys], values, [k[1] for k in keys])
    store.metrics.add(job, batch)
    got = {(p.name, p.rank, p.step): p.value for p in store.metrics.points(job, all_ranks=True)}
    assert got == expected


def test_resume_drops_later_steps_of_earlier_attempts(store: Store) -> None:
    job = new_job(store)
    store.metrics.add(job, cols(list(range(10)), attempt=1))
    store.metrics.add(job, cols(list(range(10)), name="acc", attempt=1))
    # attempt 2 resumed after step 4: 5..9 of attempt 1 are not the final lineage
    store.metrics.add(job, cols([5, 6], values=[50.0, 60.0], attempt=2), resume=(2, 4))
    assert series(store, job) == [(s, float(s), 1) for s in range(5)] + [
        (5, 50.0, 2),
        (6, 60.0, 2),
    ]
    assert [p[0] for p in series(store, job, "acc")] == list(range(5))
    # a resume again (the same attempt's retried first batch) drops nothing of its own
    store.metrics.add(job, cols([7], attempt=2), resume=(2, 4))
    assert [p[0] for p in series(store, job)] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_non_finite_values_are_stored_as_null(store: Store) -> None:
    job = new_job(store)
    values: list[float | None] = [1.0, math.nan, math.inf, -math.inf, None, 2]
    store.metrics.add(job, cols(list(range(6)), values=values))
    assert [p[1] for p in series(store, job)] == [1.0, None, None, None, None, 2.0]
    store.metrics.add(job, [MetricPoint(9, "loss", math.nan)])
    assert series(store, job)[-1] == (9, None, 0)
    assert store.jobs.get(job).latest_metrics == {"loss": None}


def test_ranks_and_the_jobs_progress(store: Store) -> None:
    job = new_job(store)
    steps = [0, 0, 0, 1, 1, 1, 2]
    names = ["loss", "loss", "loss", "loss", "loss", "acc", "loss"]
    ranks: list[int | None] = [None, 0, 1, None, 1, None, 1]  # step 2: a rank's value only
    store.metrics.add(job, cols(steps, names, [float(i) for i in range(7)], ranks), total_steps=9)
    got = store.jobs.get(job)
    assert (got.last_step, got.latest_metrics, got.total_steps) == (1, {"loss": 3.0, "acc": 5.0}, 9)
    assert series(store, job, rank=1) == [(0, 2.0, 1), (1, 4.0, 1), (2, 6.0, 1)]
    infos = store.metrics.series(job, all_ranks=True)
    assert [(i.name, i.rank, i.points, i.last_step) for i in infos] == [
        ("acc", None, 1, 1),
        ("loss", None, 2, 1),
        ("loss", 0, 1, 0),
        ("loss", 1, 3, 2),
    ]
    # the same step again merges the values; an earlier step (a restart) moves progress back,
    # and the latest value of every series stays (tests/unit/test_metric_series.py)
    store.metrics.add(job, cols([1], "lr", [0.1]))
    assert store.jobs.get(job).latest_metrics == {"loss": 3.0, "acc": 5.0, "lr": 0.1}
    store.metrics.add(job, cols([0], "loss", [7.0], attempt=2))
    got = store.jobs.get(job)
    assert (got.last_step, got.latest_metrics) == (0, {"loss": 7.0, "acc": 5.0, "lr": 0.1})


def test_metric_points_with_per_point_attempts(store: Store) -> None:
    job = new_job(store)
    points = [MetricPoint(s, f"m{s % 3}", float(s), None, 1 + s % 2, 5.0) for s in range(600)]
    assert store.metrics.add(job, points) == 600
    got = store.metrics.points(job, name="m1")
    assert [(p.step, p.attempt, p.wall_time) for p in got[:2]] == [(1, 2, 5.0), (4, 1, 5.0)]


def test_spooled_batches_in_either_format_go_through_the_same_checks(
    store: Store, tmp_path: Path
) -> None:
    job = new_job(store)
    spool = tmp_path / "metrics-spool"
    spool.mkdir()
    rows = {"batch_id": "r", "attempt": 1, "points": [[0, "loss", 1.0, None, 2.0]]}
    columns = {
        "batch_id": "c",
        "attempt": 1,
        "columns": {
            "step": [1],
            "name": ["loss"],
            "value": [None],
            "rank": [None],
            "wall_time": [3.0],
        },
    }
    bad = {"batch_id": "x", "attempt": 1, "points": [[-1, "loss", 1.0, None, 2.0]]}
    for i, payload in enumerate((rows, columns, bad)):
        (spool / f"{i}.json").write_text(json.dumps(payload))
    assert ingest_spool(store.metrics, job, AttemptLayout(tmp_path), within=tmp_path) == 2
    assert [(p.step, p.value, p.wall_time) for p in store.metrics.points(job)] == [
        (0, 1.0, 2.0),
        (1, None, 3.0),
    ]
    assert sorted(p.name for p in spool.iterdir()) == ["2.bad"]


# -- parsing -----------------------------------------------------------------------------------
def test_both_wire_formats_give_the_same_columns() -> None:
    rows = [[0, "loss", 1.5, None, 10.0], [0, "loss", 2, 3, 0]]
    a = parse_report(json.dumps({"batch_id": "b", "attempt": 2, "points": rows}))
    columns = {k: [r[i] for r in rows] for i, k in enumerate(m.COLUMN_KEYS)}
    b = parse_report(json.dumps({"batch_id": "b", "attempt": 2, "columns": columns}).encode())
    for got in (a, b):
        assert list(got.columns.steps) == [0, 0] and list(got.columns.ranks) == [None, 3]
        assert list(got.columns.values) == [1.5, 2.0]  # ints become floats
        assert type(got.columns.values[1]) is float
        assert got.columns.walls[0] == 10.0 and got.columns.walls[1] > 1e9  # 0: now
        assert got.attempt == 2 and got.columns.attempts == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{nope", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ({"attempt": 1}, "batch_id: must be a string of 1 to 64 characters, got None"),
        ({"batch_id": "b" * 65, "attempt": 1}, "batch_id: must be a string of 1 to 64"),
        ({"batch_id": "b"}, "attempt: required"),
        ({"batch_id": "b", "attempt": 0}, "attempt: must be an integer from 1"),
        ({"batch_id": "b", "attempt": "1"}, "attempt: must be an integer from 1"),
        ({"batch_id": "b", "attempt": True}, "attempt: must be an integer from 1"),
        ({"batch_id": "b", "attempt": 1, "total_steps": -1}, "total_steps: must be an integer"),
        ({"batch_id": "b", "attempt": 1, "resume_step": -2}, "resume_step: must be an integer"),
        ({"batch_id": "b", "attempt": 1, "points": "nope"}, "points: must be a list"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "a", 1.0, None]]}, "points[0]: must be"),
        ({"batch_id": "b", "attempt": 1, "points": [7]}, "points[0]: must be [step, name"),
        ({"batch_id": "b", "attempt": 1, "columns": [1]}, "columns: must be an object"),
        ({"batch_id": "b", "attempt": 1, "columns": {"step": [1]}}, "columns.name: must be a"),
    ],
)
def test_malformed_reports_are_named(body: object, message: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body)
    with pytest.raises(InvalidMetrics) as err:
        parse_report(raw)
    assert message in str(err.value)
    assert err.value.status == 422 and err.value.code == "invalid_request"


GOOD = [0, "loss", 1.0, None, 1.0]


@pytest.mark.parametrize(
    ("index", "bad", "message"),
    [
        (0, -1, "step must be an integer from 0 to 9223372036854775807, got -1"),
        (0, INT64 + 1, "step must be an integer"),
        (0, 1.0, "step must be an integer"),
        (0, True, "step must be an integer"),
        (0, "3", "step must be an integer"),
        (1, "", "name must be a string of 1 to 256 characters without NUL, got 0 characters"),
        (1, "x" * 257, "got 257 characters"),
        (1, "a\x00b", "without NUL"),
        (1, 5, "name must be a string"),
        (1, ["a"], "name must be a string"),
        (2, "1.0", "value must be a number or null, got '1.0'"),
        (2, [1.0], "value must be a number or null"),
        (2, False, "value must be a number or null"),
        (3, -1, "rank must be null (the job's value) or an integer from 0 to 1000000, got -1"),
        (3, 1_000_001, "rank must be null"),
        (3, "0", "rank must be null"),
        (3, [0], "rank must be null"),
        (4, None, "wall_time must be a finite number (unix time), got None"),
        (4, "now", "wall_time must be a finite number"),
    ],
)
def test_a_bad_point_is_named_in_both_formats(index: int, bad: object, message: str) -> None:
    point = list(GOOD)
    point[index] = bad
    points = [list(GOOD), list(GOOD), point, list(GOOD)]
    with pytest.raises(InvalidMetrics) as err:
        parse_report(json.dumps({"batch_id": "b", "attempt": 1, "points": points}))
    assert str(err.value).startswith("points[2]: ") and message in str(err.value)
    columns = {k: [p[i] for p in points] for i, k in enumerate(m.COLUMN_KEYS)}
    with pytest.raises(InvalidMetrics) as err:
        parse_report(json.dumps({"batch_id": "b", "attempt": 1, "columns": columns}))
    assert str(err.value).startswith("point[2]: ") and message in str(err.value)


def test_report_size_and_column_length_limits() -> None:
    too_many = {"batch_id": "b", "attempt": 1, "points": [GOOD] * (m.MAX_REPORT_POINTS + 1)}
    with pytest.raises(InvalidMetrics, match="at most 200000 points per report, got 200001"):
        parse_report(json.dumps(too_many))
    columns = {k: [v] for k, v in zip(m.COLUMN_KEYS, GOOD, strict=True)}
    columns["rank"] = [None, None]
    with pytest.raises(InvalidMetrics, match="same length, got step 1, name 1, value 1, rank 2"):
        parse_report(json.dumps({"batch_id": "b", "attempt": 1, "columns": columns}))
    empty = parse_report(b'{"batch_id": "b", "attempt": 1}')  # a heartbeat
    assert len(empty.columns) == 0


# -- reads and downsampling ---------------------------------------------------------------------
def fill(store: Store, job: int, steps: list[int], values: list[float | None]) -> SeriesInfo:
    for start in range(0, len(steps), 50_000):
        part = slice(start, start + 50_000)
        store.metrics.add(job, cols(steps[part], values=values[part]))
    (info,) = store.metrics.series(job, name="loss")
    return info


def check_downsampled(
    got: SeriesPoints, steps: list[int], values: list[float | None], max_points: int
) -> None:
    stored = dict(zip(steps, values, strict=True))
    pts = got.points
    assert got.downsampled and got.total_points == len(steps)
    assert 4 <= len(pts) <= max_points
    got_steps = [p[0] for p in pts]
    assert got_steps == sorted(set(got_steps))  # by step, each once
    assert all(stored[s] == v for s, v, _ in pts)  # real points, not averages
    assert got_steps[0] == steps[0] and got_steps[-1] == steps[-1]  # first and last survive
    finite = [v for v in values if v is not None]
    got_values = [v for _, v, _ in pts if v is not None]
    assert min(got_values) == min(finite) and max(got_values) == max(finite)  # extremes survive


def test_downsampling_keeps_the_extremes_and_the_ends(store: Store) -> None:
    job = new_job(store)
    rng = random.Random(5)
    steps = list(range(0, 60_000, 3))  # 20,000 points with a gap in the middle
    steps = [s for s in steps if not 20_000 < s < 30_000]
    values: list[float | None] = [rng.gauss(0, 1) for _ in steps]
    values[1234] = 50.0  # a spike
    values[4321] = -50.0
    values[777] = None  # a NaN
    info = fill(store, job, steps, values)
    assert (info.points, info.first_step, info.last_step) == (len(steps), 0, steps[-1])
    for max_points in (4, 5, 100, 1000):
        got = store.metrics.series_points(job, info, max_points=max_points)
        check_downsampled(got, steps, values, max_points)
    got = store.metrics.series_points(job, info, max_points=len(steps))  # enough: every point
    assert not got.downsampled and len(got.points) == len(steps)
    assert got.points[777] == (steps[777], None, 1.0)


def test_downsampling_shows_a_stretch_of_nan(store: Store) -> None:
    job = new_job(store)
    steps = list(range(1000))
    values: list[float | None] = [float(s % 7) for s in steps]
    values[400:600] = [None] * 200  # diverged for a while
    info = fill(store, job, steps, values)
    got = store.metrics.series_points(job, info, max_points=50)
    assert len(got.points) <= 50
    assert any(v is None and 400 <= s < 600 for s, v, _ in got.points)


def test_downsampling_constant_sparse_and_huge_steps(store: Store) -> None:
    job = new_job(store)
    steps = [0, 1, 2, INT64 - 2, INT64 - 1, INT64]  # no overflow near the largest step
    steps += [s * 10**12 for s in range(3, 500)]
    steps.sort()
    values: list[float | None] = [1.0] * len(steps)  # ties everywhere: earliest wins
    info = fill(store, job, steps, values)
    got = store.metrics.series_points(job, info, max_points=10)
    assert len(got.points) <= 10 and got.points[0][0] == 0 and got.points[-1][0] == INT64


def test_after_step_and_series_listing(store: Store) -> None:
    job = new_job(store)
    steps = list(range(100))
    fill(store, job, steps, [float(s) for s in steps])
    store.metrics.add(job, cols([5, 6], "acc"))
    (info,) = store.metrics.series(job, name="loss", after_step=89)
    assert (info.points, info.first_step, info.last_step) == (10, 90, 99)
    got = store.metrics.series_points(job, info)
    assert [p[0] for p in got.points] == list(range(90, 100)) and not got.downsampled
    down = store.metrics.series_points(job, info, max_points=4)
    assert down.points[0][0] == 90 and down.points[-1][0] == 99 and len(down.points) <= 4
    assert store.metrics.series(job, after_step=99) == []
    assert [(i.name, i.points) for i in store.metrics.series(job, after_step=5)] == [
        ("acc", 1),
        ("loss", 94),
    ]
