"""Downsampled metric queries: how long a 1,000,000-point series takes to answer.

A fresh SQLite store (a temporary home, the store's own migrations and pragmas) gets one job
(ended, so the server's scheduler leaves it alone) with a ``loss`` series of ``--points``
points (1,000,000: steps 0.., Gaussian noise on a decaying curve, with a few spikes) and
``--others`` more series (3) of ``--other-points`` points each (100,000), logged every
``points / other-points`` steps, all stored through ``store.metrics.add`` in batches of 50,000
as a running job would report them (so the series interleave on disk).

Then, ``--repeats`` times each (15; 5 with ``--quick``), median and best:

- **direct**: ``store.metrics.series(job, name="loss")`` + ``store.metrics.series_points(...,
  max_points=--max-points)`` (1000), what the route does, without HTTP;
- **HTTP**: ``GET /api/v1/jobs/{id}/metrics?name=loss&max_points=1000`` against a real server
  process (``trainhouse.client.serverprocess.ServerProcess`` on the same home), through httpx;
- for context: every series of the job downsampled (``max_points`` only), the series list
  (``GET .../metrics/names``) and, once, the whole ``loss`` series without downsampling.

Every downsampled answer is checked: at most ``max_points`` points, the first and last steps and
the series' smallest and largest values among them. Target: the downsampled query of the
1,000,000-point series (HTTP) answers in under 100 ms (median). It prints PASS or BELOW TARGET
and exits 0 either way.

    python bench/query.py [--quick] [--points 1000000] [--others 3] [--other-points 100000]
                          [--max-points 1000] [--repeats 15] [--quiet-wait 30] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from _machine import log, wait_quiet

from trainhouse.client.serverprocess import ServerProcess, free_port
from trainhouse.core.reports import Columns
from trainhouse.lifecycle import JobState
from trainhouse.store import Store, default_db_url

TARGET_MS = 100.0
BATCH = 50_000
NAME = "loss"


def fill(store: Store, job: int, points: int, others: int, other_points: int) -> float:
    """Store the series as a job would report them; returns the seconds it took."""
    rng = random.Random(1)
    every = max(1, points // max(1, other_points))
    spikes = {points // 3: 25.0, points // 2: -25.0, points - 7: 40.0}
    start = time.perf_counter()
    for first in range(0, points, BATCH):
        steps, names, values = [], [], []
        for step in range(first, min(first + BATCH, points)):
            steps.append(step)
            names.append(NAME)
            values.append(spikes.get(step, 2.0 * math.exp(-step / points) + rng.gauss(0, 0.1)))
            if step % every == 0:
                for i in range(others):
                    steps.append(step)
                    names.append(f"other_{i}")
                    values.append(1.0 / (1 + step) + i)
        n = len(steps)
        store.metrics.add(job, Columns(steps, names, values, [None] * n, [1.0] * n, 1))
    return time.perf_counter() - start


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return times, result


def stats(times: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(times), "best_ms": min(times), "max_ms": max(times)}


def check(points: list[Any], max_points: int, lo: int, hi: int, low: float, high: float) -> None:
    steps = [p[0] for p in points]
    values = [p[1] for p in points if p[1] is not None]
    problems = []
    if len(points) > max_points:
        problems.append(f"{len(points)} points > max_points {max_points}")
    if steps[0] != lo or steps[-1] != hi:
        problems.append(f"steps {steps[0]}..{steps[-1]}, not {lo}..{hi}")
    if min(values) != low or max(values) != high:
        problems.append(f"values {min(values)}..{max(values)}, not {low}..{high}")
    if problems:
        raise RuntimeError("wrong downsampled answer: " + "; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Downsampled query time of a large series.")
    parser.add_argument("--quick", action="store_true", help="5 repeats (still 1e6 points)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="20,000 points, 1 repeat, no quiet wait (the suite's check)",
    )
    parser.add_argument("--points", type=int, default=1_000_000, help="loss points (1e6)")
    parser.add_argument("--others", type=int, default=3, help="other series (3)")
    parser.add_argument("--other-points", type=int, default=100_000, help="their points (1e5)")
    parser.add_argument("--max-points", type=int, default=1000, help="max_points (1000)")
    parser.add_argument("--repeats", type=int, help="timed queries per kind (15; 5 --quick)")
    parser.add_argument(
        "--quiet-wait", type=float, help="seconds to wait for a quiet machine (30; 5 --quick)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.points, args.other_points, args.others = 20_000, 2_000, 1
        args.repeats = args.repeats or 1
        args.quiet_wait = 0.0 if args.quiet_wait is None else args.quiet_wait
    repeats = args.repeats or (5 if args.quick else 15)
    quiet = args.quiet_wait if args.quiet_wait is not None else (5.0 if args.quick else 30.0)
    if args.points < 2 or args.max_points < 4 or repeats < 1 or args.others < 0:
        parser.error("--points >= 2, --max-points >= 4, --repeats >= 1, --others >= 0")

    root = Path(tempfile.mkdtemp(prefix="trainhouse-bench-query-"))
    home = root / "home"
    home.mkdir()
    server: ServerProcess | None = None
    try:
        store = Store(default_db_url(home))
        job = store.jobs.create(
            name="query-bench",
            owner="bench",
            priority="normal",
            spec={"entrypoint": "python train.py"},
            archive_sha256="0",
        ).id
        store.jobs.transition(job, JobState.CANCELED, reason="benchmark data only")
        total = args.points + args.others * min(args.other_points, args.points)
        log(f"storing {args.points:,} {NAME} points and {args.others} other series ...")
        fill_s = fill(store, job, args.points, args.others, args.other_points)
        log(f"  {fill_s:.1f} s ({total / fill_s:,.0f} points/s through store.metrics.add)")
        with store.engine.connect() as conn:
            low, high = conn.exec_driver_sql(
                f"SELECT min(value), max(value) FROM metrics WHERE name = '{NAME}'"
            ).one()
        lo, hi = 0, args.points - 1
        mp = args.max_points
        busy = wait_quiet(quiet)

        def direct() -> Any:
            (info,) = store.metrics.series(job, name=NAME)
            return store.metrics.series_points(job, info, max_points=mp)

        log("direct (Store) ...")
        direct_times, got = timed(direct, repeats)
        check(got.points, mp, lo, hi, low, high)
        store.close()

        server = ServerProcess(home, free_port(), "--cpus", "2", "--gpus", "0").start()
        url = f"{server.url}/api/v1/jobs/{job}/metrics"
        with httpx.Client(timeout=600) as http:

            def get(params: dict[str, Any], path: str = "") -> Any:
                resp = http.get(url + path, params=params)
                resp.raise_for_status()
                return resp.json()

            get({"name": NAME, "max_points": mp})  # a first request: connections, imports
            log("HTTP ...")
            http_times, data = timed(lambda: get({"name": NAME, "max_points": mp}), repeats)
            check(data["series"][0]["points"], mp, lo, hi, low, high)
            log("HTTP, every series ...")
            job_times, _ = timed(lambda: get({"max_points": mp}), repeats)
            names_times, _ = timed(lambda: get({}, "/names"), repeats)
            log("HTTP, the whole series once ...")
            full_times, full = timed(lambda: get({"name": NAME}), 1)
            if len(full["series"][0]["points"]) != args.points:
                raise RuntimeError("the whole series came back incomplete")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)

    summary = {
        "points": args.points,
        "other_series": args.others,
        "other_points": args.other_points,
        "max_points": mp,
        "repeats": repeats,
        "returned_points": len(data["series"][0]["points"]),
        "direct": stats(direct_times),
        "http": stats(http_times),
        "http_every_series": stats(job_times),
        "http_names": stats(names_times),
        "http_whole_series_ms": full_times[0],
        "target_ms": TARGET_MS,
        "ok": statistics.median(http_times) < TARGET_MS,
        "cpu_busy_before": busy,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"metric query: a {args.points:,}-point series (+ {args.others} series of "
        f"{args.other_points:,}), SQLite, max_points={mp}, median of {repeats}"
    )
    rows = [
        ("downsampled, direct (Store)", summary["direct"]),
        ("downsampled, HTTP GET .../metrics?name=", summary["http"]),
        ("every series downsampled, HTTP", summary["http_every_series"]),
        ("series names, HTTP GET .../metrics/names", summary["http_names"]),
    ]
    for label, s in rows:
        print(f"  {label:44s} {s['median_ms']:8.1f} ms  (best {s['best_ms']:.1f})")
    print(f"  {'the whole series, HTTP (once)':44s} {full_times[0]:8.1f} ms")
    print(
        f"  returned {summary['returned_points']} points; downsampled HTTP median "
        f"{summary['http']['median_ms']:.1f} ms vs target < {TARGET_MS:.0f} ms: "
        f"{'PASS' if summary['ok'] else 'BELOW TARGET'}"
    )
    if busy > 15:
        print(f"  note: other processes used {busy:.0f}% of the CPUs before the timed queries")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
