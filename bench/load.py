"""Metric reporting under load: many running jobs reporting at once, PostgreSQL vs SQLite.

The issues: "100 concurrent clients reporting metrics for 60 s against the PostgreSQL store, then
against SQLite: zero lost points (counted), p50/p99 request latency and points/s for both in the
same run" (issue 9), and issue 19's goal for small reports: "at least 5x today's points/s on
both backends with 100 clients and 0 points lost; p99 latency printed. Add a 500-client run."

Per backend (PostgreSQL first, then SQLite; ``--db``), per client count (``--clients``: 100
and 500) and per way of storing (the server's group commit, and with ``--baseline``, the
default, one transaction per report as before it), one run:

Server
    The real ``trainhouse server`` command (``bench/_load_server.py``: the same option parsing,
    uvicorn, ``create_app``, scheduler loop, routes, per-attempt credential check and metric
    ingest) in a subprocess with a temporary home, a free port, ``--cpus`` max(128, clients)
    and ``--gpus 0``, against a scratch PostgreSQL database (``trainhouse_bench_<random>``,
    created from ``--pg``, dropped at the end) or the default SQLite file under the home. Only
    the executor is a stand-in: an attempt it "launches" starts no process, its
    ``TRAINHOUSE_JOB_TOKEN`` (made by the scheduler loop) goes to a JSON-lines file this
    benchmark reads, and it stays running until the scheduler stops it. Where the installed
    trainhouse has ``trainhouse db upgrade`` (``python -m trainhouse db --help`` exits 0), it
    runs on the PostgreSQL database first (and on any database the server refuses to start on
    with a message naming it). The baseline runs set the server's ``report_group_commit`` off
    (``$TRAINHOUSE_BENCH_ONE_PER_TRANSACTION``): each report is stored in a transaction of its
    own in the request's thread, the path every report took before group commit.

Jobs
    One per client, submitted through the REST API (``Client.submit_packed``: a multipart POST
    /api/v1/jobs with a one-file workdir archive), each one process with one CPU core; the
    benchmark waits until every one is RUNNING and its token is known.

Clients
    One asyncio task per job with its own ``httpx.AsyncClient`` (its own connection, opened
    before the clock starts), all in this process (``bench/_load_clients.py``). Each posts
    ``POST /api/v1/jobs/{id}/report`` with ``Authorization: Bearer <token>``, one after the
    other for ``--duration`` seconds (60; 10 with ``--quick``): ``--series`` (10) series x
    ``--steps`` (10) consecutive steps per request, the job's own values (rank null), a fresh
    ``batch_id`` per request, encoded by the SDK's own code (``sdk._metrics.as_columns``,
    ``trainhouse.core.wire.encode_json``). A request that fails with a transport error or a 5xx
    (a 503 of a full queue too) is retried with the same body (the same batch id, as the SDK
    does) until it is acknowledged or ``--retry-for`` seconds (30) past the end; a 4xx is not
    retried. Latency is per HTTP request that got a 2xx answer; points/s is the points of
    acknowledged requests over the time from the start to the last answer.

Counting
    With the server still up, a direct SQL count of the points stored per job and per request's
    step block (every request covers its own steps), compared with what was sent: a point of an
    acknowledged request that is not stored is lost. The job's ``GET .../metrics/names``
    totals (the server's own read path) must agree with the SQL count. Points of requests
    never acknowledged are shown apart (they may or may not be stored).

It prints a table (backend, clients, requests, points/s, p50 ms, p99 ms, errors, lost points,
the way of storing), the PostgreSQL/SQLite ratios of points/s and p99, ``<backend>: lost
points: N``, and issue 19's goal per backend and client count: the points/s of group commit
over the issue's numbers for 100 clients (10,000 points/s on SQLite, 5,000 on PostgreSQL), p99,
lost points and PASS (>= 5x, nothing lost) or BELOW TARGET, with the ratio to this run's
one-transaction-per-report run: group commit's own share (that run has the rest of this
version's report path, faster than the one the issue measured; the version before issue 19 is
measured by running this benchmark from its checkout). It exits 1 if an acknowledged point is
missing, the counts disagree, a request was refused (4xx) or a run could not be made; 0
otherwise, whatever the speed.

``--smoke`` (a few seconds, for the test suite): 4 clients x 2 s, SQLite only unless ``--db``
says otherwise, no baseline, no waiting for a quiet machine.

    python bench/load.py [--smoke | --quick] [--clients 100,500] [--duration 60] [--series 10]
                         [--steps 10] [--db both|pg|sqlite] [--no-baseline]
                         [--pg postgresql://postgres@127.0.0.1/postgres] [--quiet-wait 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
from _load_clients import count, drive, percentile, stored_blocks
from _machine import BUSY_PERCENT, log, wait_quiet

from trainhouse.client import Client
from trainhouse.client.serverprocess import ServerProcess, free_port
from trainhouse.errors import ServerStartError
from trainhouse.jobfs.workdir import pack
from trainhouse.spec import load_spec

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_load_server.py"
TOKENS_ENV = "TRAINHOUSE_BENCH_TOKENS"  # bench/_load_server.py's
ONE_PER_TRANSACTION_ENV = "TRAINHOUSE_BENCH_ONE_PER_TRANSACTION"  # bench/_load_server.py's
DEFAULT_PG = os.environ.get("TRAINHOUSE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = {"pg": ["postgresql"], "sqlite": ["sqlite"], "both": ["postgresql", "sqlite"]}
# issue 19: "with 100 clients sending small reports (10 series x 10 steps), the server stores
# about 10k points/s on SQLite ... and 5k on PostgreSQL"; the goal: at least 5x that
ISSUE_POINTS_PER_S = {"sqlite": 10_000.0, "postgresql": 5_000.0}
TARGET = 5.0
MODES = {True: "group", False: "one-each"}  # report_group_commit -> the table's name

SPEC = """
name: load-bench
entrypoint: python train.py
workdir: .
resources: {nodes: 1, procs_per_node: 1, gpus_per_node: 0, cpus_per_proc: 1}
max_restarts: 0
"""
SCRIPT = "# never run: the benchmark's executor starts no process\n"


# -- PostgreSQL and the schema ---------------------------------------------------------------
@contextlib.contextmanager
def scratch_pg(admin: str) -> Iterator[str]:
    """A fresh database next to ``admin``'s, as a SQLAlchemy URL; dropped afterwards."""
    name = f"trainhouse_bench_{uuid.uuid4().hex[:12]}"
    admin = admin.replace("postgresql+psycopg://", "postgresql://", 1)  # psycopg's own form
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"  dropped the scratch database {name}")


def trainhouse_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainhouse", *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def has_db_upgrade() -> bool:
    """Whether this trainhouse has ``trainhouse db upgrade`` (newer ones need it on PostgreSQL)."""
    return trainhouse_cli("db", "--help").returncode == 0


def db_upgrade(url: str) -> None:
    log("  python -m trainhouse db upgrade --db ...")
    done = trainhouse_cli("db", "upgrade", "--db", url)
    if done.returncode != 0:
        raise RuntimeError(f"trainhouse db upgrade failed:\n{done.stdout}{done.stderr}")


# -- the server ------------------------------------------------------------------------------
class LoadServer(ServerProcess):
    """``bench/_load_server.py`` (``trainhouse server`` with the stand-in executor)."""

    def __init__(self, home: Path, db_url: str | None, cpus: int, group_commit: bool) -> None:
        args = ["--cpus", str(cpus), "--gpus", "0"]
        if db_url:
            args += ["--db", db_url]
        super().__init__(home, free_port(), *args, log=home.parent / "server.log")
        self.db_url = db_url
        self.group_commit = group_commit
        self.tokens = home.parent / "tokens.jsonl"

    def command(self) -> list[str]:
        return [sys.executable, str(DRIVER), *super().command()[4:]]  # past "... server"

    def environment(self) -> dict[str, str]:
        self.tokens.touch()
        env = {**super().environment(), TOKENS_ENV: str(self.tokens)}
        env.pop(ONE_PER_TRANSACTION_ENV, None)
        if not self.group_commit:
            env[ONE_PER_TRANSACTION_ENV] = "1"
        return env

    def cpu_seconds(self) -> float:
        if self.proc is None:
            return 0.0
        with contextlib.suppress(psutil.Error):
            return float(sum(psutil.Process(self.proc.pid).cpu_times()[:2]))
        return 0.0

    def read_tokens(self) -> dict[int, dict[str, Any]]:
        found: dict[int, dict[str, Any]] = {}
        for line in self.tokens.read_text().splitlines():
            if line.endswith("}"):  # a line still being written is skipped
                record = json.loads(line)
                found[int(record["job_id"])] = record  # the latest attempt wins
        return found


def start_server(
    home: Path, db_url: str | None, cpus: int, upgrade: bool, group_commit: bool
) -> LoadServer:
    """Start it; run ``trainhouse db upgrade`` first (PostgreSQL) or after a refusal naming it."""
    if upgrade and db_url:
        db_upgrade(db_url)
    server = LoadServer(home, db_url, cpus, group_commit)
    try:
        server.start()
    except ServerStartError:
        tail = server.log_tail()
        if not (upgrade and "db upgrade" in tail):
            raise
        log("  the server asks for `trainhouse db upgrade`; running it and starting again")
        db_upgrade(db_url or f"sqlite:///{home / 'trainhouse.db'}")
        server = LoadServer(home, db_url, cpus, group_commit)
        server.start()
    return server


def submit_jobs(server: LoadServer, root: Path, count: int) -> dict[int, dict[str, Any]]:
    """``count`` jobs through POST /api/v1/jobs; waits until each runs. Job id -> its launch."""
    workdir = root / "workdir"
    workdir.mkdir()
    (workdir / "train.py").write_text(SCRIPT)
    (workdir / "trainhouse.yaml").write_text(textwrap.dedent(SPEC))
    spec = load_spec(workdir / "trainhouse.yaml")
    packed = pack(workdir)
    with Client(server.url) as client:
        ids = [int(client.submit_packed(spec, packed)["id"]) for _ in range(count)]
        deadline = time.monotonic() + 120
        while True:
            launched = server.read_tokens()
            if all(i in launched for i in ids):
                break
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(f"the server exited:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                waiting = [i for i in ids if i not in launched]
                raise RuntimeError(
                    f"{len(waiting)} jobs not started after 120 s, e.g. job {waiting[0]}: "
                    f"{client.job(waiting[0])}"
                )
            time.sleep(0.2)
        states = {client.job(i)["state"] for i in ids}
        if states != {"RUNNING"}:
            raise RuntimeError(f"the jobs are {sorted(states)}, not all RUNNING")
    return {i: launched[i] for i in ids}


# -- one run ---------------------------------------------------------------------------------
def run_once(
    backend: str, clients: int, group_commit: bool, args: argparse.Namespace, upgrade: bool
) -> dict[str, Any]:
    """One server, ``clients`` jobs and clients, reporting for ``args.duration`` s."""
    root = Path(tempfile.mkdtemp(prefix=f"trainhouse-bench-load-{backend}-"))
    try:
        with contextlib.ExitStack() as stack:
            home = root / "home"
            db_url = stack.enter_context(scratch_pg(args.pg)) if backend == "postgresql" else None
            count_url = db_url or f"sqlite:///{home / 'trainhouse.db'}"
            server = start_server(home, db_url, max(128, clients), upgrade, group_commit)
            stack.callback(server.stop)
            log(f"  server at {server.url}; submitting {clients} jobs ...")
            launches = submit_jobs(server, root, clients)
            wait_quiet(args.op_wait)
            log(f"  {clients} clients reporting for {args.duration:g} s, {MODES[group_commit]}")
            psutil.cpu_percent()  # start the machine-wide counter
            me = psutil.Process()
            cpu0, mine0 = server.cpu_seconds(), sum(me.cpu_times()[:2])
            results, start, end = asyncio.run(
                drive(server.url, launches, args.series, args.steps, args.duration, args.retry_for)
            )
            machine = psutil.cpu_percent()
            server_cpu = server.cpu_seconds() - cpu0
            client_cpu = sum(me.cpu_times()[:2]) - mine0
            log("  counting the points stored ...")
            stored = stored_blocks(count_url, list(launches), args.steps)
            with Client(server.url) as client:
                api_totals = {
                    job: sum(int(s["points"]) for s in client.metric_names(job)) for job in launches
                }
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(f"the server died during the run:\n{server.log_tail()}")
            server_log_errors = server.log_tail(1_000_000).count(" ERROR ")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    per_request = args.series * args.steps
    latencies = sorted(x for r in results for x in r.latencies)
    counted = count(results, stored, api_totals, per_request)
    seconds = end - start
    return {
        "backend": backend,
        "clients": clients,
        "mode": MODES[group_commit],
        "duration_s": args.duration,
        "seconds": seconds,
        "requests": len(latencies),
        "points_per_request": per_request,
        "points_per_s": counted["acknowledged_points"] / seconds,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "max_ms": 1000 * (latencies[-1] if latencies else math.nan),
        "mean_ms": 1000 * (statistics.fmean(latencies) if latencies else math.nan),
        "errors": sum(r.errors for r in results),
        "refused": sum(r.refused for r in results),
        "error_samples": [m for r in results for m in r.messages][:5],
        "requests_per_client_min": min(len(r.latencies) for r in results),
        "requests_per_client_max": max(len(r.latencies) for r in results),
        "server_cpu_s": server_cpu,
        "client_cpu_s": client_cpu,
        "machine_cpu_percent": machine,
        "server_log_errors": server_log_errors,
        **counted,
    }


def failures(r: dict[str, Any]) -> list[str]:
    out = []
    if r["lost_points"]:
        out.append(f"{r['lost_points']} acknowledged points are not stored")
    if r["api_mismatch"]:
        out.append(f"GET .../metrics/names disagrees with SQL (api, sql): {r['api_mismatch']}")
    if r["unexpected_points"]:
        out.append(f"{r['unexpected_points']} stored points were never sent")
    if r["refused"]:
        out.append(f"{r['refused']} requests refused: {r['error_samples']}")
    return out


def goals(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 19's goal per backend and client count: group commit's points/s at least 5x the
    issue's numbers for 100 clients, nothing lost; with the ratio to this run's
    one-transaction-per-report run (group commit's own share: that run has the rest of this
    version's report path, so it is faster than the version the issue measured)."""
    out = []
    by = {(r["backend"], r["clients"], r["mode"]): r for r in runs}
    for (backend, clients, mode), r in by.items():
        if mode != "group":
            continue
        base = by.get((backend, clients, "one-each"))
        ratio = r["points_per_s"] / ISSUE_POINTS_PER_S[backend]
        out.append(
            {
                "backend": backend,
                "clients": clients,
                "points_per_s": r["points_per_s"],
                "ratio": ratio,
                "one_each_points_per_s": base["points_per_s"] if base else None,
                "ratio_to_one_each": r["points_per_s"] / base["points_per_s"] if base else None,
                "p99_ms": r["p99_ms"],
                "one_each_p99_ms": base["p99_ms"] if base else None,
                "lost_points": r["lost_points"],
                "met": ratio >= TARGET and not r["lost_points"],
            }
        )
    return out


def print_goals(met: list[dict[str, Any]]) -> None:
    if met:
        print(
            f"  goal (issue 19): >= {TARGET:g}x the issue's points/s for 100 clients (SQLite "
            f"{ISSUE_POINTS_PER_S['sqlite']:,.0f}, PostgreSQL "
            f"{ISSUE_POINTS_PER_S['postgresql']:,.0f}), 0 points lost"
        )
    for g in met:
        share = ""
        if g["one_each_points_per_s"] is not None:
            share = (
                f"; {g['ratio_to_one_each']:.1f}x this run's one transaction per report "
                f"({g['one_each_points_per_s']:,.0f} points/s, p99 {g['one_each_p99_ms']:.1f} ms)"
            )
        print(
            f"  {g['backend']} {g['clients']} clients: {g['points_per_s']:,.0f} points/s = "
            f"{g['ratio']:.1f}x the issue's {ISSUE_POINTS_PER_S[g['backend']]:,.0f}{share}; "
            f"p99 {g['p99_ms']:.1f} ms; lost {g['lost_points']}: "
            f"{'PASS' if g['met'] else 'BELOW TARGET'}"
        )


def print_report(
    runs: list[dict[str, Any]], met: list[dict[str, Any]], args: argparse.Namespace
) -> None:
    print(
        f"metric reporting under load: {args.duration:g} s per run, {args.series} series x "
        f"{args.steps} steps = {args.series * args.steps} points per request"
    )
    print(
        f"  {'backend':<11}{'clients':>8}{'requests':>10}{'points/s':>11}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}{'errors':>8}{'lost points':>13}  storing"
    )
    for r in runs:
        print(
            f"  {r['backend']:<11}{r['clients']:>8}{r['requests']:>10,}{r['points_per_s']:>11,.0f}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}{r['errors']:>8}"
            f"{r['lost_points']:>13}  {r['mode']}"
        )
    mode = MODES[bool(args.group_commit)]
    first = {r["backend"]: r for r in runs if r["clients"] == args.clients[0] and r["mode"] == mode}
    if "postgresql" in first and "sqlite" in first:
        pg, lite = first["postgresql"], first["sqlite"]
        print(
            f"  PostgreSQL/SQLite: points/s {pg['points_per_s'] / lite['points_per_s']:.2f}, "
            f"p99 latency {pg['p99_ms'] / lite['p99_ms']:.2f} ({pg['clients']} clients, "
            f"{pg['mode']})"
        )
    for r in runs:
        print(
            f"  {r['backend']}: lost points: {r['lost_points']} ({r['clients']} clients, "
            f"{r['mode']}; {r['acknowledged_points']:,} acknowledged, {r['stored_points']:,} "
            f"stored, {r['accepted_points']:,} accepted; {r['unacknowledged_points']} in "
            f"unacknowledged requests, {r['unacknowledged_stored']} of them stored); requests "
            f"per client {r['requests_per_client_min']}-{r['requests_per_client_max']}; CPU: "
            f"server {1e6 * r['server_cpu_s'] / max(1, r['acknowledged_points']):.1f} us/point, "
            f"this client {100 * r['client_cpu_s'] / r['seconds']:.0f}% of a core, machine "
            f"{r['machine_cpu_percent']:.0f}%"
        )
        if r["errors"]:
            print(f"    {r['errors']} failed requests (retried), e.g. {r['error_samples'][:2]}")
        if r["server_log_errors"]:
            print(f"    the server logged {r['server_log_errors']} errors")
    print_goals(met)


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Concurrent metric reporting, PG vs SQLite.")
    parser.add_argument("--smoke", action="store_true", help="seconds: 4 clients x 2 s, SQLite")
    parser.add_argument("--quick", action="store_true", help="10 s per run")
    parser.add_argument(
        "--clients", help="concurrent jobs, a comma-separated list (100,500; 4 --smoke)"
    )
    parser.add_argument("--duration", type=float, help="seconds per run (60; 10 --quick)")
    parser.add_argument("--series", type=int, default=10, help="series per request (10)")
    parser.add_argument("--steps", type=int, default=10, help="steps per request (10)")
    parser.add_argument("--db", choices=sorted(BACKENDS), help="(both; sqlite --smoke)")
    parser.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        help="also run each with one transaction per report (on; off --smoke)",
    )
    parser.add_argument(
        "--group-commit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run with the server's group commit (on)",
    )
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL admin URL (%(default)s)")
    parser.add_argument(
        "--retry-for", type=float, default=30.0, help="retrying past the end, seconds (30)"
    )
    parser.add_argument(
        "--quiet-wait", type=float, help="seconds to wait for a quiet machine (30; 5 --quick)"
    )
    parser.add_argument("--op-wait", type=float, help="the same before each run (10; 2 --quick)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    smoke = args.smoke
    args.clients = [
        int(c) for c in (args.clients or ("4" if smoke else "100,500")).split(",") if c.strip()
    ]
    args.db = args.db or ("sqlite" if smoke else "both")
    if args.baseline is None:
        args.baseline = not smoke
    if args.duration is None:
        args.duration = 2.0 if smoke else 10.0 if args.quick else 60.0
    quiet = 0.0 if smoke else 5.0 if args.quick else 30.0
    args.quiet_wait = quiet if args.quiet_wait is None else args.quiet_wait
    if args.op_wait is None:
        args.op_wait = min(args.quiet_wait, 2.0 if args.quick else 10.0)
    if not args.clients or min(*args.clients, args.series, args.steps) < 1 or args.duration <= 0:
        parser.error("--clients, --series, --steps must be >= 1 and --duration > 0")
    if args.series * args.steps > 200_000:
        parser.error("--series x --steps must be <= 200,000 (the server's limit per report)")
    if not (args.group_commit or args.baseline):
        parser.error("--no-group-commit needs --baseline: nothing would run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    busy = wait_quiet(args.quiet_wait)
    upgrade = has_db_upgrade()
    log(f"trainhouse db upgrade: {'found, used' if upgrade else 'not in this trainhouse'}")
    modes = [m for m, on in ((True, args.group_commit), (False, args.baseline)) if on]
    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    for backend in BACKENDS[args.db]:
        for clients in args.clients:
            for group_commit in modes:
                log(f"{backend}, {clients} clients, {MODES[group_commit]}:")
                try:
                    r = run_once(backend, clients, group_commit, args, upgrade)
                except Exception as exc:  # the other runs still run; the exit code says it
                    problems.append(f"{backend}: not measured: {type(exc).__name__}: {exc}")
                    log(problems[-1])
                    continue
                runs.append(r)
                log(
                    f"  {r['points_per_s']:,.0f} points/s, p50 {r['p50_ms']:.1f} ms, "
                    f"p99 {r['p99_ms']:.1f}"
                )
                problems += [f"{backend} ({clients}, {r['mode']}): {p}" for p in failures(r)]
    met = goals(runs)
    if args.json:
        print(json.dumps({"runs": runs, "goals": met, "problems": problems}, indent=2))
        return 1 if problems else 0
    print_report(runs, met, args)
    for p in problems:
        print(f"  FAILED: {p}")
    if busy > BUSY_PERCENT:
        print(
            f"  note: other processes used {busy:.0f}% of the CPUs before the run; "
            "rerun on a quiet machine for steadier numbers"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
