"""Metric ingestion: points/s through the SDK, HTTP and the server vs raw SQLite inserts.

End to end
    A real server (``trainhouse.client.serverprocess.ServerProcess``: a temporary home, a free port,
    SQLite, ``--cpus`` max(2, ranks)) runs a real job whose script (written to a temporary
    workdir, submitted with ``trainhouse.client.Client.submit``) logs as fast as it can:
    ``run.log({metric_000: v, ..., metric_<series-1>: v}, step=step)`` at every step, on every
    rank (``procs_per_node: --ranks``; with more than one rank ``all_ranks=True``, so rank 0
    logs the job's values and its own, every other rank its own). Each rank's SDK buffers the
    points and its background thread posts batches of ``--batch`` points (the SDK's
    ``max_batch``) to ``POST /api/v1/jobs/{id}/report``, which stores each batch in one
    SQLite transaction. The clock starts on every rank after a barrier, before the first
    ``run.log``, and stops when ``with trainhouse.init()`` has closed on every rank: the SDK's
    final flush returned, so every point is stored. ``--points`` is the total over all series
    and ranks (the steps are derived from it). The benchmark then checks that the server holds
    exactly that many points.

Raw SQLite ceiling (same run, same machine, same disk)
    Plain ``sqlite3`` ``executemany`` of prebuilt rows of the same shape (job, attempt, rank,
    step, name, value, wall_time) into a fresh database with the same schema and indexes
    (made by the store's own migrations) and the same pragmas (the store's: WAL,
    ``synchronous=FULL``, foreign keys), one transaction per batch of ``--batch`` rows:
    ``INSERT`` (the ceiling) and, for reference, ``INSERT ... ON CONFLICT DO UPDATE`` (what
    storing a metric means: a step logged again replaces its value). It runs before and after
    each end-to-end run (``--repeats``: 2; 1 with ``--quick``), alternating; the best run of
    each side counts, so a burst of other work on the machine hurts neither side alone. Each
    end-to-end run first waits up to ``--op-wait`` seconds (10; 2) for a quiet machine.

MLflow
    When ``import mlflow`` works: ``MlflowClient.log_batch`` (1,000 metrics per call, its
    limit) into a SQLite tracking store in the same temporary directory, for up to 200,000 of
    the same points. Skipped with a note otherwise.

Targets: end to end >= 100,000 points/s, and >= 0.5 of the raw ceiling. It prints PASS or
BELOW TARGET and exits 0 either way: it is a benchmark, not a test.

    python bench/ingest.py [--quick] [--points 1000000] [--series 8] [--ranks 1]
                           [--batch 50000] [--repeats 2] [--quiet-wait 30] [--op-wait 10]
                           [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from _machine import BUSY_PERCENT, log, wait_quiet

from trainhouse.client import Client
from trainhouse.client.serverprocess import ServerProcess, free_port
from trainhouse.store import Store
from trainhouse.store.database import _sqlite_pragmas

TARGET_RATE = 100_000
TARGET_RATIO = 0.5
MLFLOW_POINTS = 200_000
RESULT_TAG = "trainhouse-bench-ingest"

SCRIPT = f"""
import json
import time

import trainhouse

with trainhouse.init() as run:
    series, steps, batch = (int(run.hparams[k]) for k in ("series", "steps", "batch"))
    all_ranks = run.world_size > 1
    names = [f"metric_{{i:03d}}" for i in range(series)]
    if run.world_size > 1:
        import torch.distributed as dist

        dist.barrier()
    t0 = time.time()
    for step in range(steps):
        x = step * 1e-4
        run.log({{n: x + i for i, n in enumerate(names)}}, step=step, all_ranks=all_ranks)
        if step == 0:  # the benchmark's --batch, set on the rank's reporter (the run's server link)
            reporter = run._metrics.link.reporter
            if reporter is not None:
                reporter.max_batch = batch
    points = steps * series * (2 if all_ranks and run.is_main else 1)
t1 = time.time()  # the SDK's last flush returned: everything is stored
print("{RESULT_TAG}", json.dumps({{"rank": run.rank, "t0": t0, "t1": t1, "points": points}}),
      flush=True)
"""

SPEC = """
name: ingest-bench
entrypoint: python train.py
workdir: .
resources: {{nodes: 1, procs_per_node: {ranks}, gpus_per_node: 0, cpus_per_proc: 1}}
max_restarts: 0
hparams: {{series: {series}, steps: {steps}, batch: {batch}}}
env: {{OMP_NUM_THREADS: "1"}}
"""


def shape(points: int, series: int, ranks: int) -> tuple[int, int]:
    """(steps, points per step) so that steps * points per step is about ``points``."""
    tags = ranks + 1 if ranks > 1 else 1  # the job's values + each rank's
    per_step = series * tags
    return max(1, round(points / per_step)), per_step


def rows(steps: int, series: int, ranks: int) -> Iterator[tuple[Any, ...]]:
    """The rows the end-to-end run stores, in the order rank 0 sends them."""
    names = [f"metric_{i:03d}" for i in range(series)]
    tags: list[int] = [-1, *range(ranks)] if ranks > 1 else [-1]
    now = time.time()
    for step in range(steps):
        x = step * 1e-4
        for rank in tags:
            for i, name in enumerate(names):
                yield (1, 1, rank, step, name, x + i, now)


# -- the raw ceiling -------------------------------------------------------------------------
def raw_sqlite(
    root: Path, steps: int, series: int, ranks: int, batch: int, upsert: bool
) -> dict[str, Any]:
    """Plain executemany of prebuilt rows, one transaction per batch: points/s."""
    directory = Path(tempfile.mkdtemp(prefix="raw-", dir=root))
    try:
        db = directory / "raw.db"
        store = Store(f"sqlite:///{db}")  # the same schema and indexes, by the same migrations
        store.jobs.create(
            name="raw",
            owner="bench",
            priority="normal",
            spec={"entrypoint": "python train.py"},
            archive_sha256="0",
        )
        store.close()
        all_rows = list(rows(steps, series, ranks))
        batches = [all_rows[i : i + batch] for i in range(0, len(all_rows), batch)]
        conn = sqlite3.connect(db, isolation_level=None)
        _sqlite_pragmas(conn, None)  # the store's own pragmas
        sql = (
            "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        if upsert:
            sql += (
                " ON CONFLICT (job_id, name, rank, step) DO UPDATE SET value = excluded.value, "
                "attempt = excluded.attempt, wall_time = excluded.wall_time"
            )
        start = time.perf_counter()
        for chunk in batches:
            conn.execute("BEGIN")
            conn.executemany(sql, chunk)
            conn.execute("COMMIT")
        seconds = time.perf_counter() - start
        stored = conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
        conn.close()
        return {"points": stored, "seconds": seconds, "rate": stored / seconds}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- end to end ------------------------------------------------------------------------------
def end_to_end(
    root: Path, steps: int, series: int, ranks: int, batch: int, expected: int
) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="e2e-", dir=root))  # a fresh server each run
    home = run_dir / "home"
    workdir = run_dir / "workdir"
    workdir.mkdir()
    (workdir / "train.py").write_text(textwrap.dedent(SCRIPT))
    spec = workdir / "trainhouse.yaml"
    spec.write_text(SPEC.format(ranks=ranks, series=series, steps=steps, batch=batch))
    server = ServerProcess(home, free_port(), "--cpus", str(max(2, ranks)), "--gpus", "0")
    server.start()
    try:
        proc = psutil.Process(server.proc.pid) if server.proc else None
        cpu0 = sum(proc.cpu_times()[:2]) if proc else 0.0
        with Client(server.url) as client:
            job = client.submit(spec)
            final = client.wait(int(job["id"]), timeout=1800, poll=0.2)
            cpu = (sum(proc.cpu_times()[:2]) - cpu0) if proc else 0.0
            results = []
            for rank in range(ranks):
                text, _, _ = client.logs(final["id"], rank=rank)
                results += [
                    json.loads(line.split(RESULT_TAG, 1)[1])
                    for line in text.splitlines()
                    if RESULT_TAG in line
                ]
            if final["state"] != "COMPLETED" or len(results) != ranks:
                text, _, _ = client.logs(final["id"], rank=0, tail=40)
                raise RuntimeError(f"the job ended {final['state']}: {final['reason']}\n{text}")
            stored = sum(s["points"] for s in client.metric_names(final["id"]))
    finally:
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    points = sum(r["points"] for r in results)
    seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    if stored != points or points != expected:
        raise RuntimeError(f"the job logged {points} points, the server holds {stored}")
    return {
        "points": points,
        "seconds": seconds,
        "rate": points / seconds,
        "server_cpu_seconds": cpu,
    }


# -- MLflow ----------------------------------------------------------------------------------
def mlflow_batch(root: Path, steps: int, series: int, ranks: int) -> dict[str, Any] | None:
    try:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient
    except ImportError:
        return None
    directory = Path(tempfile.mkdtemp(prefix="mlflow-", dir=root))
    try:
        client = MlflowClient(tracking_uri=f"sqlite:///{directory / 'mlflow.db'}")
        exp = client.create_experiment("ingest-bench", artifact_location=str(directory / "art"))
        run_id = client.create_run(exp).info.run_id
        metrics = []
        for _job, _attempt, rank, step, name, value, wall in rows(steps, series, ranks):
            key = name if rank < 0 else f"{name}/rank{rank}"
            metrics.append(Metric(key, value, int(wall * 1000), step))
            if len(metrics) >= MLFLOW_POINTS:
                break
        start = time.perf_counter()
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
        seconds = time.perf_counter() - start
        client.set_terminated(run_id)
        return {"points": len(metrics), "seconds": seconds, "rate": len(metrics) / seconds}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- main ------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "BELOW TARGET"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Metric ingestion vs raw SQLite inserts.")
    parser.add_argument("--quick", action="store_true", help="300,000 points (< 60 s)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="20,000 points, 1 run, no quiet wait (the suite's check)",
    )
    parser.add_argument("--points", type=int, help="total points, all series and ranks (1e6)")
    parser.add_argument("--series", type=int, default=8, help="metrics per step (8)")
    parser.add_argument("--ranks", type=int, default=1, help="ranks of the job (1)")
    parser.add_argument("--batch", type=int, default=50_000, help="points per report (50000)")
    parser.add_argument(
        "--quiet-wait", type=float, help="seconds to wait for a quiet machine (30; 5 --quick)"
    )
    parser.add_argument(
        "--repeats", type=int, help="end-to-end runs, each between two raw runs (2; 1 --quick)"
    )
    parser.add_argument(
        "--op-wait",
        type=float,
        help="seconds to wait before each end-to-end run for a quiet machine (10; 2 --quick)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.points = args.points or 20_000
        args.batch = min(args.batch, 5_000)
        args.quick = True
        args.quiet_wait = 0.0 if args.quiet_wait is None else args.quiet_wait
        args.op_wait = 0.0 if args.op_wait is None else args.op_wait
    total = args.points or (300_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 2)
    op_wait = args.op_wait if args.op_wait is not None else (2.0 if args.quick else 10.0)
    if min(total, args.series, args.ranks, args.batch, repeats) < 1 or args.batch > 200_000:
        parser.error("--points, --series, --ranks, --repeats must be >= 1, --batch 1..200000")
    steps, per_step = shape(total, args.series, args.ranks)
    expected = steps * per_step
    quiet = args.quiet_wait if args.quiet_wait is not None else (5.0 if args.quick else 30.0)

    busy_before = wait_quiet(quiet)
    log(
        f"{expected:,} points: {steps:,} steps x {args.series} series x "
        f"{per_step // args.series} rank tag(s); batches of {args.batch:,}"
    )
    root = Path(tempfile.mkdtemp(prefix="trainhouse-bench-ingest-"))
    psutil.cpu_percent()  # start the machine-wide CPU counter
    raw: list[dict[str, Any]] = []
    upsert: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    shape_args = (steps, args.series, args.ranks, args.batch)

    def raw_pair() -> None:
        raw.append(raw_sqlite(root, *shape_args, upsert=False))
        upsert.append(raw_sqlite(root, *shape_args, upsert=True))
        log(f"  raw INSERT {raw[-1]['rate']:,.0f}, ON CONFLICT {upsert[-1]['rate']:,.0f} points/s")

    try:
        for n in range(repeats):  # raw, end to end, raw, end to end, ..., raw
            raw_pair()
            wait_quiet(op_wait)
            log(f"end to end {n + 1}/{repeats}: a job logging through the SDK into a server ...")
            runs.append(end_to_end(root, *shape_args, expected))
            log(f"  {runs[-1]['rate']:,.0f} points/s ({runs[-1]['seconds']:.2f} s)")
        raw_pair()
        cpu_during = psutil.cpu_percent()  # this benchmark's own use included
        mlflow = mlflow_batch(root, steps, args.series, args.ranks)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    e2e = max(runs, key=lambda r: float(r["rate"]))  # the best of each side
    ceiling = max(r["rate"] for r in raw)
    upsert_rate = max(r["rate"] for r in upsert)
    ratio = e2e["rate"] / ceiling
    summary: dict[str, Any] = {
        "points": expected,
        "steps": steps,
        "series": args.series,
        "ranks": args.ranks,
        "batch": args.batch,
        "end_to_end": e2e,
        "end_to_end_runs": runs,
        "raw_insert": raw,
        "raw_upsert": upsert,
        "raw_ceiling_rate": ceiling,
        "ratio": ratio,
        "target_rate": TARGET_RATE,
        "target_ratio": TARGET_RATIO,
        "rate_ok": e2e["rate"] >= TARGET_RATE,
        "ratio_ok": ratio >= TARGET_RATIO,
        "mlflow": mlflow,
        "cpu_busy_before": busy_before,
        "cpu_busy_during": cpu_during,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    us = 1e6 * e2e["server_cpu_seconds"] / expected
    print(
        f"metric ingestion: {expected:,} points ({steps:,} steps x {args.series} series x "
        f"{per_step // args.series} rank tag(s), {args.ranks} rank(s)), batches of "
        f"{args.batch:,}, SQLite"
    )
    print(
        f"  end to end (run.log -> SDK -> HTTP -> server -> SQLite): {e2e['rate']:>11,.0f} "
        f"points/s  (best of {repeats}: " + ", ".join(f"{r['rate']:,.0f}" for r in runs) + ")"
    )
    print(f"  server process CPU over the whole job (its start included): {us:.1f} us/point")
    print(
        f"  raw SQLite executemany INSERT (ceiling):          {ceiling:>11,.0f} points/s  "
        f"(best of {len(raw)})"
    )
    print(f"  raw SQLite executemany INSERT ... ON CONFLICT:   {upsert_rate:>11,.0f} points/s")
    print(
        f"  end to end / raw ceiling: {ratio:.2f} (target >= {TARGET_RATIO}): "
        f"{verdict(summary['ratio_ok'])}"
    )
    print(f"  end to end >= {TARGET_RATE:,} points/s: {verdict(summary['rate_ok'])}")
    if mlflow is None:
        print("  MLflow log_batch: mlflow is not installed; skipped (pip install mlflow)")
    else:
        print(
            f"  MLflow log_batch (SQLite store, {mlflow['points']:,} points): "
            f"{mlflow['rate']:,.0f} points/s; trainhouse end to end is "
            f"{e2e['rate'] / mlflow['rate']:.1f}x"
        )
    if busy_before > BUSY_PERCENT:
        print(
            f"  note: other processes used {busy_before:.0f}% of the CPUs before the run; "
            "rerun on a quiet machine for steadier numbers"
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
