"""The metric rollup (trainhouse.store.rollup) on SQLite and PostgreSQL: after random ingests,
replacements, NaNs and resume deletions, its buckets equal ones computed from the raw rows, and
the downsampled answers equal a slow reference computed from the raw rows alone."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.records import new_job as make_job
from trainhouse.core import reports
from trainhouse.core.reports import Columns
from trainhouse.store import Store, rollup
from trainhouse.store import metrics as m

INT64 = 2**63 - 1


def new_job(store: Store) -> int:
    return make_job(store)


def raw(store: Store, job: int) -> dict[tuple[str, int], list[tuple[int, float | None]]]:
    out: dict[tuple[str, int], list[tuple[int, float | None]]] = {}
    with store.engine.connect() as conn:
        for name, rank, step, value in conn.execute(
            sa.text(
                "SELECT name, rank, step, value FROM metrics WHERE job_id = :j "
                "ORDER BY name, rank, step"
            ),
            {"j": job},
        ):
            out.setdefault((name, rank), []).append((step, value))
    return out


def summary(points: list[tuple[int, float | None]]) -> tuple[Any, ...]:
    """(count, first, last, min value, its step, max value, its step): ties the earliest."""
    fin = [(v, s) for s, v in points if v is not None]
    # min() and max() keep the first of equal keys: the earliest step
    lo = min(fin, key=lambda p: p[0]) if fin else (None, None)
    hi = max(fin, key=lambda p: p[0]) if fin else (None, None)
    return (len(points), points[0][0], points[-1][0], lo[0], lo[1], hi[0], hi[1])


def reference_buckets(series: dict[tuple[str, int], list[tuple[int, float | None]]]) -> set:
    out = set()
    for (name, rank), points in series.items():
        for width in rollup.LEVELS:
            by: dict[int, list[tuple[int, float | None]]] = {}
            for s, v in points:
                by.setdefault(s // width, []).append((s, v))
            for k, pts in by.items():
                out.add((name, rank, width, k, *summary(pts)))
    return out


def stored_buckets(store: Store, job: int) -> set:
    with store.engine.connect() as conn:
        return {
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT name, rank, level, bucket, count, first_step, last_step, min_value, "
                    "min_step, max_value, max_step FROM metric_buckets WHERE job_id = :j"
                ),
                {"j": job},
            )
        }


def reference_downsample(
    points: list[tuple[int, float | None]], lo: int, hi: int, max_points: int
) -> list[tuple[int, float | None]]:
    """The answer from the raw points: the same step intervals as the query's (rollup buckets
    inside the range, finer ones and single steps at its edges, grouped by step when there are
    more than the output buckets), each summarised from the points themselves."""
    buckets = (max_points - 2) // 2
    width = -(-(hi - lo + 1) // buckets)
    top = next(
        (i for i, b in enumerate(rollup.BITS) if (hi >> b) - (lo >> b) + 1 <= 8 * buckets),
        len(rollup.BITS) - 1,
    )

    def cell(s: int, a: int, z: int, level: int) -> tuple[int, int]:
        """The interval of the cover of a..z that holds step s: (level, bucket)."""
        if level < 0:
            return (-1, s)
        w = 1 << rollup.BITS[level]
        k0, k1 = -(-a // w), (z + 1) // w - 1
        if k0 > k1:
            return cell(s, a, z, level - 1)
        if s < k0 * w:
            return cell(s, a, k0 * w - 1, level - 1)
        if s > (k1 + 1) * w - 1:
            return cell(s, (k1 + 1) * w, z, level - 1)
        return (level, s // w)

    inside = [(s, v) for s, v in points if lo <= s <= hi]
    cells: list[list[tuple[int, float | None]]] = []
    last = None
    for s, v in inside:  # by step: a cell's points are consecutive
        key = cell(s, lo, hi, top)
        if key != last:
            cells.append([])
            last = key
        cells[-1].append((s, v))
    if len(cells) > buckets:
        grouped: dict[int, list[tuple[int, float | None]]] = {}
        for pts in cells:
            grouped.setdefault((pts[0][0] - lo) // width, []).extend(pts)
        cells = list(grouped.values())
    keep = {lo, hi}
    for pts in cells:
        _, first, _, _, lo_at, _, hi_at = summary(pts)
        keep.add(first if lo_at is None else lo_at)
        if hi_at is not None:
            keep.add(hi_at)
    return [(s, v) for s, v in inside if s in keep]


def check(store: Store, job: int) -> None:
    series = raw(store, job)
    assert stored_buckets(store, job) == reference_buckets(series)
    infos = {
        (i.name, -1 if i.rank is None else i.rank): i
        for i in store.metrics.series(job, all_ranks=True)
    }
    assert {k: (i.points, i.first_step, i.last_step) for k, i in infos.items()} == {
        k: (len(p), p[0][0], p[-1][0]) for k, p in series.items()
    }
    for key, info in infos.items():
        points = series[key]
        for max_points in (4, 9, 50, 300):
            if max_points >= info.points:
                continue
            got = store.metrics.series_points(job, info, max_points=max_points)
            assert got.downsampled and len(got.points) <= max_points
            want = reference_downsample(points, info.first_step, info.last_step, max_points)
            assert [(s, v) for s, v, _ in got.points] == want
        # a live poll's range does not fall on bucket bounds
        if len(points) < 12:
            continue
        after = points[len(points) // 3][0]
        (part,) = store.metrics.series(job, name=key[0], rank=info.rank, after_step=after)
        if part.points > 10:
            got = store.metrics.series_points(job, part, max_points=10)
            want = reference_downsample(points, part.first_step, part.last_step, 10)
            assert [(s, v) for s, v, _ in got.points] == want


def test_the_rollup_follows_random_ingests_replacements_and_resumes(store: Store) -> None:
    job = new_job(store)
    rng = random.Random(11)
    attempt = 1
    nxt = {"loss": 0, "acc": 0}
    for round_ in range(14):
        op = rng.random()
        steps: list[int] = []
        names: list[str] = []
        if op < 0.2 and max(nxt.values()) > 100:  # a restart from a checkpoint
            attempt += 1
            resume = rng.randrange(0, max(nxt.values()))
            for name in nxt:
                nxt[name] = min(nxt[name], resume + 1)
        else:
            resume = None
        for name in nxt:
            if op < 0.4 and nxt[name] > 10:  # log some steps again (replacements)
                start = rng.randrange(0, nxt[name])
            else:
                start = nxt[name] + rng.choice([0, 0, 1, 37, 5000])  # appends, with gaps
            n = rng.choice([1, 15, 16, 300, 2500])
            stride = rng.choice([1, 1, 3])
            for s in range(start, start + n * stride, stride):
                steps.append(s)
                names.append(name)
            nxt[name] = max(nxt[name], start + n * stride)
        values: list[float | None] = [
            None if rng.random() < 0.05 else float(rng.randint(-20, 20)) for _ in steps
        ]
        if round_ == 5:  # a run of NaN longer than a bucket
            values[:200] = [None] * min(200, len(values))
        ranks: list[int | None] = [rng.choice([None, None, 0]) for _ in steps]
        cols = reports.check_columns(
            Columns(steps, names, values, ranks, [1.0] * len(steps), attempt)
        )
        store.metrics.add(
            job, cols, batch_id=f"b{round_}", resume=None if resume is None else (attempt, resume)
        )
        check(store, job)


def test_the_rollup_follows_wide_batches_of_many_series(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the SDK sends each second: a few steps of each of many series, grouped by step.
    Appends that continue a bucket or cross bucket bounds at every level, steps logged again,
    out of order or twice, runs of NaN and resumes, mixed in one batch; SQLite with a small
    parameter limit, so that each read and write takes several statements."""
    monkeypatch.setattr(rollup, "SQLITE_VARIABLES", 60)
    job = new_job(store)
    rng = random.Random(5)
    keys = [(f"m{i:02d}", rank) for i in range(24) for rank in (None, 0, 3)]
    nxt = {key: rng.choice([0, 14, 250, 4090, 65530]) for key in keys}  # near bucket bounds
    attempt = 1
    for round_ in range(24):
        resume = None
        if round_ > 2 and rng.random() < 0.2:  # a restart from a checkpoint
            attempt += 1
            resume = (attempt, rng.randrange(0, max(nxt.values())))
            nxt = {key: min(n, resume[1] + 1) for key, n in nxt.items()}
        points: list[tuple[int, str, float | None, int | None]] = []
        for name, rank in rng.sample(keys, rng.choice([1, 5, 40, len(keys)])):
            op, start = rng.random(), nxt[(name, rank)]
            n = rng.choice([1, 1, 2, 3, 5, 17])
            if op < 0.1 and start > 0:  # log some steps again
                run = list(range(rng.randrange(max(0, start - 40), start), start + n))
            elif op < 0.15:  # out of order, or a step twice in one batch
                run = rng.choice([[start + 1, start, start + 2], [start, start]])
            else:  # appends, some with gaps over bucket bounds
                start += rng.choice([0, 0, 0, 1, 15, 250, 4000, 65536])
                run = list(range(start, start + n))
            nan_run = rng.random() < 0.1  # a run of NaN (and inf): no finite value
            for s in run:
                if nan_run:
                    value: float | None = rng.choice([float("nan"), float("inf")])
                else:
                    value = None if rng.random() < 0.1 else float(rng.randint(-5, 5))
                points.append((s, name, value, rank))
            nxt[(name, rank)] = max(nxt[(name, rank)], max(run) + 1)
        points.sort(key=lambda p: p[0])  # by step, as the SDK buffers them (stable)
        steps, names, values, ranks = (list(c) for c in zip(*points, strict=True))
        cols = reports.check_columns(
            Columns(steps, names, values, ranks, [1.0] * len(steps), attempt)
        )
        store.metrics.add(job, cols, batch_id=f"w{round_}", resume=resume)
        if round_ % 6 == 5:
            check(store, job)
        else:
            assert stored_buckets(store, job) == reference_buckets(raw(store, job))


class CountingCursor:
    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.statements = 0

    def execute(self, *args: Any) -> Any:
        self.statements += 1
        return self.cursor.execute(*args)

    def executemany(self, *args: Any) -> Any:
        self.statements += 1
        return self.cursor.executemany(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


def test_a_batch_costs_a_few_rollup_statements_whatever_its_series(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: list[int] = []
    refresh_many = rollup.refresh_many

    def counting(cursor: Any, *args: Any) -> None:
        proxy = CountingCursor(cursor)
        refresh_many(proxy, *args)
        counts.append(proxy.statements)

    monkeypatch.setattr(rollup, "refresh_many", counting)
    job = new_job(store)
    step = 0
    for series, steps in [(1, 100), (10, 10), (100, 1), (100, 1), (150, 3)]:
        cols = [
            (s, f"m{i:03d}", float(s % 7), None if i % 2 else 1)
            for s in range(step, step + steps)
            for i in range(series)
        ]
        steps_, names, values, ranks = (list(c) for c in zip(*cols, strict=True))
        store.metrics.add(
            job, reports.check_columns(Columns(steps_, names, values, ranks, [1.0] * len(cols), 1))
        )
        step += steps + 13
    lock = 0 if store.dialect == "sqlite" else 1  # PostgreSQL: the job's rollup lock first
    assert counts == [lock + 2] * 5  # the last buckets read, the new ones written
    # steps logged again and a resume: the points and the buckets around them read, the
    # buckets left empty deleted
    store.metrics.add(
        job,
        reports.check_columns(
            Columns([5, 3, 5], ["m000"] * 3, [1.0, 2.0, 3.0], [1] * 3, [1.0] * 3, 2)
        ),
        resume=(2, 40),
    )
    assert counts[-1] == lock + 4
    check(store, job)


def test_concurrent_batches_of_one_series_keep_the_rollup_exact(pg_url: str) -> None:
    """PostgreSQL: a batch that appends to a series while another transaction's batch to it is
    not committed yet waits for the job's rollup lock, then reads the committed buckets (it
    would otherwise merge its points into the buckets as they were and overwrite the other's
    update)."""
    store = Store(pg_url)
    try:
        job = new_job(store)

        def cols(steps: range) -> Columns:
            n = len(steps)
            return reports.check_columns(
                Columns(list(steps), ["x"] * n, [float(s) for s in steps], [0] * n, [1.0] * n, 1)
            )

        store.metrics.add(job, cols(range(0, 10)))
        with store.engine.connect() as first:
            first.begin()
            m.add(first, "postgresql", job, cols(range(10, 20)), batch_id="a")
            done = threading.Event()

            def second() -> None:
                store.metrics.add(job, cols(range(20, 30)), batch_id="b")
                done.set()

            thread = threading.Thread(target=second)
            thread.start()
            assert not done.wait(0.5)  # waiting for the first transaction
            first.commit()
        thread.join(10)
        assert done.is_set()
        check(store, job)
        assert stored_buckets(store, job) >= {
            ("x", 0, rollup.COARSEST, 0, 30, 0, 29, 0.0, 0, 29.0, 29)
        }
    finally:
        store.close()


def test_huge_steps_roll_up_without_overflow(store: Store) -> None:
    job = new_job(store)
    steps = [0, 1, INT64 - 70_000, INT64 - 1, INT64]
    store.metrics.add(
        job,
        reports.check_columns(
            Columns(steps, ["x"] * 5, [1.0, None, 3.0, -2.0, 2.0], [None] * 5, [1.0] * 5, 1)
        ),
    )
    check(store, job)
    store.metrics.add(
        job,
        reports.check_columns(Columns([INT64], ["x"], [9.0], [None], [1.0], 2)),
        resume=(2, INT64 - 2),
    )
    check(store, job)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
    else:
        yield request.getfixturevalue("pg_url")


def test_the_upgrade_backfills_the_rollup(url: str) -> None:
    old = Store(url, migrate=False)
    old.upgrade("0004")
    rng = random.Random(3)
    with old.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, name, owner, state, priority, spec, archive_sha256, "
                "created_at, attempts, restarts, cancel_requested, updated_at) "
                "VALUES (1, 'j', 'ann', 'COMPLETED', 'normal', '{}', 'x', 0, 1, 0, false, 0)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
                "VALUES (1, 1, :r, :s, :n, :v, 0)"
            ),
            [
                {"r": r, "s": s, "n": n, "v": None if s % 97 == 0 else rng.gauss(0, 1)}
                for n in ("a", "b")
                for r in (-1, 2)
                for s in range(0, 3000, 2 if n == "a" else 7)
            ],
        )
    old.close()
    store = Store(url)
    try:
        check(store, 1)
    finally:
        store.close()
