"""Rollup maintenance in metric ingestion: store-only time per batch, before and after.

``store.metrics.add`` stores a batch and, in the same transaction, maintains the rollup
(``metric_buckets``, :mod:`trainhouse.store.rollup`). The SDK sends whatever it buffered in the
last second, so a running job's batches are small and wide: a few steps of many series. This
times ``store.metrics.add`` (one transaction, commit included; no HTTP, no parsing) for three
shapes of 100 points each, every batch appending the next steps of every series:

- 1 series x 100 steps, 10 series x 10 steps, 100 series x 1 step (``--shapes`` to change),

on a fresh SQLite store (a temporary file; the store's own migrations and pragmas) and on a
fresh PostgreSQL database (``--pg``, an admin URL: a scratch database is made next to it and
dropped afterwards), each with two rollup implementations side by side:

- **before**: the rollup module as committed at ``--before`` (default ``b59845b``, the last
  commit with the per-series rollup; read with ``git show``,
  loaded as a temporary module) called as the committed ingest called it: ``refresh`` once per
  series in the batch;
- **after**: the working tree's ``rollup.refresh_many``, what ingest calls now.

Each implementation gets its own job in the same database; their batches alternate (ABBA), so
load on the machine and the database's size hurt both alike. ``--warmup`` batches (5) of each
are not timed, then ``--batches`` (60) are; it prints the median ms per batch, points/s, the
rollup's SQL statements per batch (counted through a cursor proxy on one more batch), the ratio
before / after and the benchmark process's own CPU time per batch (less sensitive to other
work on the machine; on PostgreSQL the server's share is not in it). At the end it checks that
both jobs' rollups are identical, row for row.

    python bench/rollup.py [--batches 60] [--warmup 5] [--db both|sqlite|pg]
                           [--pg postgresql://postgres@127.0.0.1:5432/postgres]
                           [--shapes 1x100,10x10,100x1] [--before b59845b] [--json]

It is a benchmark, not a test: it exits 0 unless the two rollups differ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from _machine import log, machine_busy

from trainhouse.core import reports
from trainhouse.core.reports import Columns
from trainhouse.store import Store, rollup
from trainhouse.store import metrics as metric_store

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = os.environ.get("TRAINHOUSE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = {"pg": ["postgresql"], "sqlite": ["sqlite"], "both": ["sqlite", "postgresql"]}

Series = tuple[str, int]
Points = tuple[Sequence[int], Sequence[float | None]]


# -- the two implementations -----------------------------------------------------------------
PER_SERIES_ROLLUP = "b59845b"  # the last commit whose ingest refreshed one series at a time


def before_module(ref: str) -> types.ModuleType:
    """The rollup module at git ``ref``, with the ``refresh_many`` that ingest's loop was."""
    source = subprocess.run(
        ["git", "show", f"{ref}:src/trainhouse/store/rollup.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("trainhouse_rollup_before")
    exec(compile(source, f"{ref}:rollup.py", "exec"), module.__dict__)
    if "refresh_many" not in module.__dict__:

        def refresh_many(
            cursor: Any,
            dialect: str,
            job: int,
            ranges: Mapping[Series, tuple[int, int]],
            appended: Mapping[Series, Points] | None = None,
        ) -> None:
            # the committed ingest's loop (store/metrics.py: add)
            for (name, rank), (lo, hi) in ranges.items():
                module.refresh(
                    cursor, dialect, job, name, rank, lo, hi, (appended or {}).get((name, rank))
                )

        module.refresh_many = refresh_many  # type: ignore[attr-defined]
    return module


class CountingCursor:
    """A DB-API cursor that counts the statements sent through it (an executemany is one)."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return self.cursor.execute(*args, **kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return self.cursor.executemany(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


def counting(module: types.ModuleType, counts: list[int]) -> types.ModuleType:
    """``module`` whose ``refresh_many`` appends the statements of each call to ``counts``."""
    proxy = types.ModuleType(module.__name__ + "_counting")
    proxy.__dict__.update(module.__dict__)

    def refresh_many(cursor: Any, *args: Any, **kwargs: Any) -> None:
        wrapped = CountingCursor(cursor)
        module.refresh_many(wrapped, *args, **kwargs)
        counts.append(wrapped.statements)

    proxy.refresh_many = refresh_many  # type: ignore[attr-defined]
    return proxy


@contextlib.contextmanager
def using(module: types.ModuleType) -> Iterator[None]:
    """Ingest (store/metrics.py) calls ``module`` for the rollup."""
    saved = metric_store.rollup
    metric_store.rollup = module
    try:
        yield
    finally:
        metric_store.rollup = saved


# -- databases -------------------------------------------------------------------------------
@contextlib.contextmanager
def scratch_store(backend: str, pg_admin: str) -> Iterator[Store]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="trainhouse-bench-rollup-") as tmp:
            store = Store(f"sqlite:///{Path(tmp) / 'trainhouse.db'}")
            try:
                yield store
            finally:
                store.close()
        return
    name = f"trainhouse_bench_{uuid.uuid4().hex[:12]}"
    admin = pg_admin.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        store = Store(f"{base}/{name}")
        try:
            yield store
        finally:
            store.close()
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def new_job(store: Store, label: str) -> int:
    job = store.jobs.create(
        name=f"rollup-{label}",
        owner="bench",
        priority="normal",
        spec={"entrypoint": "python train.py"},
        archive_sha256="0" * 64,
    )
    return int(job.id)


def batch(series: int, steps: int, index: int, rng: random.Random) -> Columns:
    """Batch ``index``: the next ``steps`` steps of every series, grouped by step as the SDK
    buffers them (every series at step s, then at s + 1, ...); now and then a NaN."""
    names = [f"metric_{i:03d}" for i in range(series)]
    step_col: list[int] = []
    name_col: list[str] = []
    for s in range(index * steps, (index + 1) * steps):
        step_col += [s] * series
        name_col += names
    n = len(step_col)
    values = [float("nan") if rng.random() < 0.01 else rng.gauss(0, 1) for _ in range(n)]
    return reports.check_columns(
        Columns(step_col, name_col, values, [None] * n, [time.time()] * n, 1)
    )


def buckets(store: Store, job: int) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT name, rank, level, bucket, count, first_step, last_step, min_value, "
                    "min_step, max_value, max_step FROM metric_buckets WHERE job_id = :j "
                    "ORDER BY name, rank, level, bucket"
                ),
                {"j": job},
            )
        ]


# -- the measurement -------------------------------------------------------------------------
def run_shape(
    store: Store,
    impls: dict[str, types.ModuleType],
    series: int,
    steps: int,
    warmup: int,
    batches: int,
) -> dict[str, Any]:
    jobs = {label: new_job(store, label) for label in impls}
    times: dict[str, list[float]] = {label: [] for label in impls}
    cpu: dict[str, list[float]] = {label: [] for label in impls}
    labels = list(impls)
    rng = random.Random(7)
    index = 0
    for index in range(warmup + batches):
        cols = batch(series, steps, index, rng)
        # ABBA: each side goes first every other batch
        for label in labels if index % 2 == 0 else labels[::-1]:
            with using(impls[label]):
                t0, c0 = time.perf_counter(), time.process_time()
                store.metrics.add(jobs[label], cols, batch_id=f"b{index}")
                took, used = time.perf_counter() - t0, time.process_time() - c0
            if index >= warmup:
                times[label].append(took)
                cpu[label].append(used)
    statements: dict[str, int] = {}
    cols = batch(series, steps, index + 1, rng)
    for label in labels:
        counts: list[int] = []
        with using(counting(impls[label], counts)):
            store.metrics.add(jobs[label], cols, batch_id=f"b{index + 1}")
        statements[label] = sum(counts)
    rows = {label: buckets(store, job) for label, job in jobs.items()}
    same = all(r == rows[labels[0]] for r in rows.values())
    out: dict[str, Any] = {"series": series, "steps": steps, "identical_rollups": same}
    for label in labels:
        ms = statistics.median(times[label]) * 1000
        out[label] = {
            "median_ms": ms,
            "p90_ms": statistics.quantiles(times[label], n=10)[-1] * 1000,
            "cpu_ms": statistics.median(cpu[label]) * 1000,
            "points_per_s": series * steps / (ms / 1000),
            "rollup_statements": statements[label],
        }
    if "before" in out and "after" in out:
        out["ratio"] = out["before"]["median_ms"] / out["after"]["median_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rollup cost of small wide metric batches.")
    parser.add_argument("--batches", type=int, default=60, help="timed batches per side")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="3 batches per side after 1 warm-up (the suite's check)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per side first")
    parser.add_argument("--db", choices=sorted(BACKENDS), default="both")
    parser.add_argument("--pg", default=DEFAULT_PG, help="a PostgreSQL admin URL")
    parser.add_argument("--shapes", default="1x100,10x10,100x1", help="SERIESxSTEPS,...")
    parser.add_argument(
        "--before",
        default=PER_SERIES_ROLLUP,
        help="the git ref of the 'before' rollup (default: the last per-series one)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.warmup = 3, 1
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    impls = {"before": before_module(args.before), "after": rollup}
    busy = machine_busy()
    log(f"the CPUs are {busy:.0f}% busy before the runs")
    results: list[dict[str, Any]] = []
    for backend in BACKENDS[args.db]:
        with scratch_store(backend, args.pg) as store:
            for series, steps in shapes:
                log(f"{backend}: {series} series x {steps} steps ...")
                found = run_shape(store, impls, series, steps, args.warmup, args.batches)
                found["backend"] = backend
                results.append(found)
                log(
                    f"  before {found['before']['median_ms']:.1f} ms, "
                    f"after {found['after']['median_ms']:.1f} ms, ratio {found['ratio']:.1f}x"
                )
    busy = machine_busy()
    ok = all(r["identical_rollups"] for r in results)
    if args.json:
        print(json.dumps({"results": results, "busy_after": busy, "identical": ok}, indent=2))
    else:
        print(
            f"{'backend':<11}{'shape':>10}{'before ms':>11}{'after ms':>10}{'before/after':>14}"
            f"{'after pts/s':>13}{'stmts before':>14}{'after':>7}{'cpu ms before':>15}{'after':>7}"
        )
        for r in results:
            b, a = r["before"], r["after"]
            print(
                f"{r['backend']:<11}{r['series']:>4} x {r['steps']:<3}{b['median_ms']:>11.1f}"
                f"{a['median_ms']:>10.1f}{r['ratio']:>13.1f}x{a['points_per_s']:>13,.0f}"
                f"{b['rollup_statements']:>14}{a['rollup_statements']:>7}"
                f"{b['cpu_ms']:>15.1f}{a['cpu_ms']:>7.1f}"
            )
        print(f"(median of {args.batches} batches of each; CPUs {busy:.0f}% busy after the runs)")
        print("rollups identical before/after:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
