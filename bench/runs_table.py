"""The runs table: a page of 10,000 jobs with 20 series each, filtered and sorted on metric
summaries and hparams, on SQLite and PostgreSQL.

Each backend gets a fresh store (SQLite: a temporary file; PostgreSQL: a scratch database next
to ``--pg``, dropped at the end) with ``--jobs`` ended jobs (10,000), each with 4 hparams (lr,
batch size, optimizer, seed) and ``--series`` metric series (20) of ``--points`` points (10)
each: jobs, hparams and points are bulk inserted, and the series summaries the ingest keeps
(``metric_summaries``) are made from the points by the same SQL the migration backfills with.
One job in 100 is checked afterwards: its summary equals what ``store.metrics.add`` of its
points makes.

Then, ``--repeats`` times (15) each, median and best, for the page of 50 jobs that

- **page**: ``store.runs.page`` filters ``metrics.val_loss.min < 0.5 and hparams.lr >= 1e-3
  and state = COMPLETED``, sorts by ``metrics.val_loss.min`` and carries 4 columns (two
  hparams, two summaries): the work of ``GET /api/v1/jobs?where=...&sort=...&columns=...``
  but the JSON; and the same through HTTP from a real server process on that database;
- **baseline**: the same page computed from the points (per job ``min(value)`` of the series
  from ``metrics`` for the filter and the sort, then the columns): what a page costs without
  the summaries.

It prints each, the ratio baseline / page, and PASS when the HTTP page answers in under 100 ms
(median) on every backend, BELOW TARGET otherwise; it exits 0 either way.

    python bench/runs_table.py [--smoke] [--jobs 10000] [--series 20] [--points 10]
                               [--repeats 15] [--db both|sqlite|pg] [--pg URL] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
from _machine import log, wait_quiet
from sqlalchemy import insert, text

from trainhouse.client.serverprocess import ServerProcess, free_port
from trainhouse.core.records import MetricPoint
from trainhouse.core.runquery import parse, parse_field, parse_fields
from trainhouse.lifecycle import JobState
from trainhouse.store import Store
from trainhouse.store import tables as t
from trainhouse.store.jobrows import hparam_rows

TARGET_MS = 100.0
WHERE = "metrics.val_loss.min < 0.5 and hparams.lr >= 1e-3 and state = COMPLETED"
SORT = "metrics.val_loss.min"
COLUMNS = "hparams.lr,hparams.optim,metrics.val_loss.min,metrics.loss.last"
PAGE = 50
DEFAULT_PG = os.environ.get("TRAINHOUSE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
STATES = (JobState.COMPLETED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELED)


@contextlib.contextmanager
def scratch_pg(admin: str) -> Iterator[str]:
    """A fresh database next to ``admin``'s, as a SQLAlchemy URL; dropped afterwards."""
    name = f"trainhouse_bench_{uuid.uuid4().hex[:12]}"
    admin = admin.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def series_names(n: int) -> list[str]:
    base = ["loss", "val_loss", "acc", "val_acc", "lr"]
    return (base + [f"extra_{i}" for i in range(max(0, n - len(base)))])[:n]


def fill(store: Store, jobs: int, series: int, points: int) -> None:
    rng = random.Random(1)
    names = series_names(series)
    now = time.time()
    job_rows, hp_rows, point_rows = [], [], []
    for i in range(1, jobs + 1):
        hparams = {
            "lr": 10 ** rng.uniform(-5, -1),
            "batch_size": rng.choice([32, 64, 128]),
            "optim": rng.choice(["adam", "sgd", "adamw"]),
            "seed": i,
        }
        job_rows.append(
            {
                "id": i,
                "name": f"sweep-{i:05d}",
                "owner": ("ann", "bob", "cat")[i % 3],
                "state": str(STATES[i % 4]),
                "priority": "normal",
                "spec": {"entrypoint": "python train.py", "hparams": hparams},
                "archive_sha256": "0" * 64,
                "created_at": now - jobs + i,
                "updated_at": now,
                "ended_at": now,
                "attempts": 1,
                "restarts": 0,
                "cancel_requested": False,
                "preempt_requested": False,
                "project": ("vision", "nlp")[i % 2],
                "archived": False,
            }
        )
        hp_rows += hparam_rows(i, hparams)
        scale = rng.uniform(0.2, 2.0)
        for name in names:
            for step in range(points):
                value = scale * (1.0 + rng.random()) / (1 + step)
                point_rows.append(
                    {
                        "job_id": i,
                        "attempt": 1,
                        "rank": -1,
                        "step": step,
                        "name": name,
                        "value": value,
                        "wall_time": now,
                    }
                )
    with store.engine.begin() as conn:
        for table, rows in ((t.jobs, job_rows), (t.job_hparams, hp_rows), (t.metrics, point_rows)):
            for start in range(0, len(rows), 20_000):
                conn.execute(insert(table), rows[start : start + 20_000])
        # the summaries the ingest keeps, from the points (as the migration backfills them)
        conn.execute(
            text(
                "INSERT INTO metric_summaries (job_id, name, last_step, min_value, max_value) "
                "SELECT job_id, name, max(step), min(value), max(value) FROM metrics "
                "WHERE rank = -1 GROUP BY job_id, name"
            )
        )
        conn.execute(
            text(
                "UPDATE metric_summaries SET last_value = (SELECT m.value FROM metrics m "
                "WHERE m.job_id = metric_summaries.job_id AND m.name = metric_summaries.name "
                "AND m.rank = -1 AND m.step = metric_summaries.last_step)"
            )
        )
        if store.dialect != "sqlite":
            conn.execute(text("SELECT setval('jobs_id_seq', (SELECT max(id) FROM jobs))"))
    if store.dialect != "sqlite":
        with store.engine.connect() as conn:
            conn.execute(text("COMMIT"))
            conn.execute(text("ANALYZE"))
    else:
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def check_summaries(store: Store, jobs: int) -> None:
    """Every 100th job's stored summaries equal what the ingest makes of its points."""
    probe = store.jobs.create(
        name="probe", owner="bench", priority="normal", spec={"entrypoint": "x"}, archive_sha256="0"
    ).id
    with store.engine.connect() as conn:
        for job in range(1, jobs + 1, 100):
            rows = conn.execute(
                text("SELECT name, step, value FROM metrics WHERE job_id = :j ORDER BY name, step"),
                {"j": job},
            ).all()
            want = conn.execute(
                text(
                    "SELECT name, last_step, last_value, min_value, max_value FROM "
                    "metric_summaries WHERE job_id = :j ORDER BY name"
                ),
                {"j": job},
            ).all()
            with store.engine.begin() as w:
                w.execute(text("DELETE FROM metrics WHERE job_id = :p"), {"p": probe})
                w.execute(text("DELETE FROM metric_buckets WHERE job_id = :p"), {"p": probe})
                w.execute(text("DELETE FROM metric_summaries WHERE job_id = :p"), {"p": probe})
            store.metrics.add(probe, [MetricPoint(s, n, v) for n, s, v in rows])
            got = conn.execute(
                text(
                    "SELECT name, last_step, last_value, min_value, max_value FROM "
                    "metric_summaries WHERE job_id = :p ORDER BY name"
                ),
                {"p": probe},
            ).all()
            conn.rollback()
            if [tuple(r) for r in got] != [tuple(r) for r in want]:
                raise RuntimeError(f"job {job}: the ingest's summaries differ: {got} != {want}")
    with store.engine.begin() as conn:
        for table in ("metrics", "metric_buckets", "metric_summaries", "metric_series", "events"):
            conn.execute(text(f"DELETE FROM {table} WHERE job_id = :p"), {"p": probe})
        conn.execute(text("DELETE FROM jobs WHERE id = :p"), {"p": probe})


def page(store: Store) -> list[int]:
    result = store.runs.page(
        where=parse(WHERE),
        sort=parse_field(SORT),
        order="asc",
        columns=parse_fields(COLUMNS),
        limit=PAGE,
        archived=None,
        states=None,
    )
    return [j.id for j in result.jobs]


def baseline(store: Store) -> list[int]:
    """The same page from the points: min(value) per job for the filter and the sort."""
    sql = (
        "SELECT j.id FROM jobs j JOIN (SELECT job_id, min(value) AS v FROM metrics "
        "WHERE name = 'val_loss' AND rank = -1 GROUP BY job_id) m ON m.job_id = j.id "
        "WHERE m.v < 0.5 AND j.state = 'COMPLETED' AND j.id IN (SELECT job_id FROM job_hparams "
        "WHERE key = 'lr' AND num >= 0.001) ORDER BY m.v IS NULL, m.v, j.id LIMIT :n"
    )
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(text(sql), {"n": PAGE})]
        if ids:
            marks = ", ".join(str(int(i)) for i in ids)
            conn.execute(
                text(
                    f"SELECT job_id, name, max(step), min(value), max(value) FROM metrics WHERE "
                    f"job_id IN ({marks}) AND name IN ('val_loss', 'loss') AND rank = -1 "
                    "GROUP BY job_id, name"
                )
            ).all()
            conn.execute(
                text(
                    f"SELECT * FROM job_hparams WHERE job_id IN ({marks}) "
                    "AND key IN ('lr', 'optim')"
                )
            ).all()
            conn.execute(text(f"SELECT * FROM jobs WHERE id IN ({marks})")).all()
    return ids


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return times, result


def stats(times: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(times), 2), "best_ms": round(min(times), 2)}


def run_backend(url: str, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    store = Store(url)
    log(f"  filling {args.jobs:,} jobs x {args.series} series x {args.points} points ...")
    start = time.perf_counter()
    fill(store, args.jobs, args.series, args.points)
    log(f"  {time.perf_counter() - start:.1f} s")
    check_summaries(store, args.jobs)
    wait_quiet(args.quiet_wait)
    page(store)  # warm the caches
    page_times, got = timed(lambda: page(store), args.repeats)
    base_times, want = timed(lambda: baseline(store), args.repeats)
    if got != want:
        raise RuntimeError(f"the page differs from the baseline's: {got[:5]} != {want[:5]}")
    store.close()
    server = ServerProcess(home, free_port(), "--cpus", "2", "--gpus", "0", "--db", url).start()
    try:
        params = {
            "where": WHERE,
            "sort": SORT,
            "order": "asc",
            "columns": COLUMNS,
            "limit": PAGE,
            "archived": "include",
        }
        with httpx.Client(base_url=server.url, timeout=60) as http:

            def get() -> list[int]:
                resp = http.get("/api/v1/jobs", params=params)
                resp.raise_for_status()
                return [j["id"] for j in resp.json()["jobs"]]

            if get() != want:
                raise RuntimeError("the HTTP page differs from the store's")
            http_times, _ = timed(get, args.repeats)
    finally:
        server.stop()
    p, b, h = stats(page_times), stats(base_times), stats(http_times)
    return {
        "page": p,
        "http": h,
        "baseline": b,
        "ratio": round(b["median_ms"] / max(p["median_ms"], 1e-6), 1),
        "matches": len(want),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The runs table's page time.")
    parser.add_argument("--smoke", action="store_true", help="500 jobs, 1 repeat, SQLite only")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--series", type=int, default=20)
    parser.add_argument("--points", type=int, default=10, help="points per series")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--db", choices=("both", "sqlite", "pg"), default="both")
    parser.add_argument("--pg", default=DEFAULT_PG, help="an admin URL of the PostgreSQL server")
    parser.add_argument("--quiet-wait", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.jobs, args.points, args.repeats, args.quiet_wait = 500, 3, 1, 0.0
        args.db = "sqlite" if args.db == "both" else args.db
    if args.jobs < 1 or args.series < 2 or args.points < 1 or args.repeats < 1:
        parser.error("--jobs >= 1, --series >= 2, --points >= 1, --repeats >= 1")
    root = Path(tempfile.mkdtemp(prefix="trainhouse-bench-runs-"))
    results: dict[str, Any] = {}
    try:
        if args.db in ("both", "sqlite"):
            log("SQLite ...")
            home = root / "sqlite"
            home.mkdir()
            results["sqlite"] = run_backend(f"sqlite:///{home / 'trainhouse.db'}", home, args)
        if args.db in ("both", "pg"):
            log("PostgreSQL ...")
            home = root / "pg"
            home.mkdir()
            with scratch_pg(args.pg) as url:
                results["postgresql"] = run_backend(url, home, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ok = all(r["http"]["median_ms"] < TARGET_MS for r in results.values())
    summary = {
        "jobs": args.jobs,
        "series": args.series,
        "points": args.points,
        "where": WHERE,
        "sort": SORT,
        "columns": COLUMNS,
        "results": results,
        "target_ms": TARGET_MS,
        "verdict": "PASS" if ok else "BELOW TARGET",
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"runs table: {args.jobs:,} jobs x {args.series} series ({args.points} points each)")
    print(f"  where {WHERE}; sort {SORT}; columns {COLUMNS}; a page of {PAGE}")
    for backend, r in results.items():
        print(
            f"  {backend:<10} page {r['page']['median_ms']:7.2f} ms "
            f"(best {r['page']['best_ms']:.2f})"
            f"  HTTP {r['http']['median_ms']:7.2f} ms  baseline from the points "
            f"{r['baseline']['median_ms']:8.2f} ms  ratio {r['ratio']}x  ({r['matches']} rows)"
        )
    print(f"  target: HTTP page < {TARGET_MS:.0f} ms: {summary['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
