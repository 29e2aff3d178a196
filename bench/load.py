"""Metric reporting under load: many running jobs reporting at once, PostgreSQL vs SQLite.

The issue: "100 concurrent clients reporting metrics for 60 s against the PostgreSQL store, then
against SQLite: zero lost points (counted), p50/p99 request latency and points/s for both in the
same run."

Per backend (PostgreSQL first, then SQLite; ``--db``):

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
    with a message naming it).

Jobs
    ``--clients`` jobs (100), submitted through the REST API (``Client.submit_packed``: a
    multipart POST /api/v1/jobs with a one-file workdir archive), each one process with one CPU
    core; the benchmark waits until every one is RUNNING and its token is known.

Clients
    One asyncio task per job with its own ``httpx.AsyncClient`` (its own connection, opened
    before the clock starts), all in this process. Each posts
    ``POST /api/v1/jobs/{id}/report`` with ``Authorization: Bearer <token>``, one after the
    other for ``--duration`` seconds (60; 10 with ``--quick``): ``--series`` (10) series x
    ``--steps`` (10) consecutive steps per request, the job's own values (rank null), a fresh
    ``batch_id`` per request, encoded by the SDK's own code (``sdk._metrics.as_columns``,
    ``trainhouse._http.encode_json``). A request that fails with a transport error or a 5xx is
    retried with the same body (the same batch id, as the SDK does) until it is acknowledged
    or ``--retry-for`` seconds (30) past the end; a 4xx is not retried. Latency is per HTTP
    request that got a 2xx answer; points/s is the points of acknowledged requests over the
    time from the start to the last answer.

Counting
    With the server still up, a direct SQL count of the points stored per job and per request's
    step block (every request covers its own steps), compared with what was sent: a point of an
    acknowledged request that is not stored is lost. The job's ``GET .../metrics/names``
    totals (the server's own read path) must agree with the SQL count. Points of requests
    never acknowledged are shown apart (they may or may not be stored).

It prints a table (backend, clients, requests, points/s, p50 ms, p99 ms, errors, lost points),
the PostgreSQL/SQLite ratios of points/s and p99, and ``<backend>: lost points: N``. It exits 1
if an acknowledged point is missing, the counts disagree, a request was refused (4xx) or a
backend could not be measured; 0 otherwise, whatever the speed.

    python bench/load.py [--quick] [--clients 100] [--duration 60] [--series 10] [--steps 10]
                         [--db both|pg|sqlite] [--pg postgresql://postgres@127.0.0.1/postgres]
                         [--quiet-wait 30] [--json]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import sqlalchemy
from _machine import BUSY_PERCENT, log, wait_quiet

from trainhouse._http import CLIENT_HEADERS, JSON_HEADERS, encode_json, error_from
from trainhouse.client import Client
from trainhouse.errors import ServerStartError
from trainhouse.sdk._metrics import Point, as_columns
from trainhouse.serverprocess import ServerProcess, free_port
from trainhouse.spec import load_spec
from trainhouse.workdir import pack

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_load_server.py"
TOKENS_ENV = "TRAINHOUSE_BENCH_TOKENS"  # bench/_load_server.py's
DEFAULT_PG = os.environ.get("TRAINHOUSE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = {"pg": ["postgresql"], "sqlite": ["sqlite"], "both": ["postgresql", "sqlite"]}
REQUEST_TIMEOUT = 120.0  # seconds: a slow answer is measured, not turned into an error

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

    def __init__(self, home: Path, db_url: str | None, cpus: int) -> None:
        args = ["--cpus", str(cpus), "--gpus", "0"]
        if db_url:
            args += ["--db", db_url]
        super().__init__(home, free_port(), *args, log=home.parent / "server.log")
        self.db_url = db_url
        self.tokens = home.parent / "tokens.jsonl"

    def command(self) -> list[str]:
        return [sys.executable, str(DRIVER), *super().command()[4:]]  # past "... server"

    def environment(self) -> dict[str, str]:
        self.tokens.touch()
        return {**super().environment(), TOKENS_ENV: str(self.tokens)}

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


def start_server(home: Path, db_url: str | None, cpus: int, upgrade: bool) -> LoadServer:
    """Start it; run ``trainhouse db upgrade`` first (PostgreSQL) or after a refusal naming it."""
    if upgrade and db_url:
        db_upgrade(db_url)
    server = LoadServer(home, db_url, cpus)
    try:
        server.start()
    except ServerStartError:
        tail = server.log_tail()
        if not (upgrade and "db upgrade" in tail):
            raise
        log("  the server asks for `trainhouse db upgrade`; running it and starting again")
        db_upgrade(db_url or f"sqlite:///{home / 'trainhouse.db'}")
        server = LoadServer(home, db_url, cpus)
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


# -- the clients -----------------------------------------------------------------------------
@dataclass
class ClientResult:
    job_id: int
    latencies: list[float] = field(default_factory=list)  # seconds, 2xx answers
    acked: list[int] = field(default_factory=list)  # step blocks acknowledged
    unacked: list[int] = field(default_factory=list)  # step blocks sent, never acknowledged
    accepted: int = 0  # the sum of the answers' "accepted"
    errors: int = 0  # failed requests (transport errors, 5xx), each retried
    refused: int = 0  # 4xx answers (not retried: the benchmark is wrong)
    messages: list[str] = field(default_factory=list)
    last_answer: float = 0.0  # perf_counter of the last answer


def batch_body(attempt: int, block: int, names: list[str], steps: int) -> bytes:
    """One report: ``steps`` consecutive steps of every series, as the SDK encodes it."""
    wall = time.time()
    points: list[Point] = [
        (step, name, step * 1e-3 + i, None, wall)
        for step in range(block * steps, (block + 1) * steps)
        for i, name in enumerate(names)
    ]
    payload = {"batch_id": uuid.uuid4().hex, "attempt": attempt, "columns": as_columns(points)}
    return encode_json(payload)


async def one_client(
    url: str,
    launch: dict[str, Any],
    names: list[str],
    steps: int,
    ready: asyncio.Queue[None],
    go: asyncio.Event,
    clock: dict[str, float],
    retry_for: float,
) -> ClientResult:
    result = ClientResult(int(launch["job_id"]))
    async with httpx.AsyncClient(
        base_url=f"{url}/api/v1/jobs/{result.job_id}",
        headers={"Authorization": f"Bearer {launch['token']}", **JSON_HEADERS, **CLIENT_HEADERS},
        timeout=REQUEST_TIMEOUT,
        limits=httpx.Limits(max_connections=1),
    ) as http:
        try:  # open the connection before the clock starts
            (await http.get(f"{url}/api/v1/health")).raise_for_status()
        finally:
            ready.put_nowait(None)  # a failure surfaces from gather(), not as a hang
        await go.wait()
        block = 0
        while time.perf_counter() < clock["deadline"]:
            body = batch_body(int(launch["attempt"]), block, names, steps)
            give_up = clock["deadline"] + retry_for
            delay = 0.1
            while True:
                began = time.perf_counter()
                problem = ""
                try:
                    resp = await http.post("/report", content=body)
                except httpx.TransportError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    now = time.perf_counter()
                    if resp.status_code < 300:
                        result.latencies.append(now - began)
                        result.accepted += int(resp.json()["accepted"])
                        result.acked.append(block)
                        result.last_answer = now
                        break
                    problem = f"HTTP {resp.status_code}: {error_from(resp, url)}"
                    if resp.status_code < 500:
                        result.refused += 1
                        result.unacked.append(block)
                        result.messages.append(problem)
                        return result  # a refusal is a bug of the benchmark or the server
                result.errors += 1
                if len(result.messages) < 5:
                    result.messages.append(problem)
                if time.perf_counter() + delay > give_up:
                    result.unacked.append(block)
                    return result
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            block += 1
    return result


async def drive(
    url: str,
    launches: dict[int, dict[str, Any]],
    series: int,
    steps: int,
    duration: float,
    retry_for: float,
) -> tuple[list[ClientResult], float, float]:
    """Every client at once for ``duration`` s; (results, start, end) in perf_counter time."""
    names = [f"metric_{i:02d}" for i in range(series)]
    ready: asyncio.Queue[None] = asyncio.Queue()
    go = asyncio.Event()
    clock = {"deadline": math.inf}
    tasks = [
        asyncio.create_task(one_client(url, launch, names, steps, ready, go, clock, retry_for))
        for launch in launches.values()
    ]
    for _ in tasks:
        await ready.get()
    start = time.perf_counter()
    clock["deadline"] = start + duration
    go.set()
    results = await asyncio.gather(*tasks)
    end = max([r.last_answer for r in results] + [start + 1e-9])
    return list(results), start, end


# -- counting --------------------------------------------------------------------------------
def stored_blocks(db_url: str, job_ids: list[int], steps: int) -> dict[tuple[int, int], int]:
    """(job, step block) -> points stored, by SQL on the server's database."""
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sqlalchemy.text(
                    "SELECT job_id, step / :steps AS block, count(*) FROM metrics "
                    "WHERE job_id >= :lo AND job_id <= :hi GROUP BY job_id, step / :steps"
                ),
                {"steps": steps, "lo": min(job_ids), "hi": max(job_ids)},
            ).all()
    finally:
        engine.dispose()
    return {(int(j), int(b)): int(n) for j, b, n in rows}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def count(
    results: list[ClientResult],
    stored: dict[tuple[int, int], int],
    api_totals: dict[int, int],
    per_request: int,
) -> dict[str, Any]:
    acked_points = lost = unacked_points = unacked_stored = 0
    for r in results:
        acked_points += per_request * len(r.acked)
        lost += sum(per_request - stored.get((r.job_id, b), 0) for b in r.acked)
        unacked_points += per_request * len(r.unacked)
        unacked_stored += sum(stored.get((r.job_id, b), 0) for b in r.unacked)
    sent_blocks = {(r.job_id, b) for r in results for b in (*r.acked, *r.unacked)}
    unexpected = sum(n for key, n in stored.items() if key not in sent_blocks)
    sql_totals: dict[int, int] = {}
    for (job, _), n in stored.items():
        sql_totals[job] = sql_totals.get(job, 0) + n
    mismatched = {
        job: (api_totals.get(job, 0), sql_totals.get(job, 0))
        for job in {r.job_id for r in results}
        if api_totals.get(job, 0) != sql_totals.get(job, 0)
    }
    return {
        "acknowledged_points": acked_points,
        "accepted_points": sum(r.accepted for r in results),
        "stored_points": sum(stored.values()),
        "lost_points": lost,
        "unacknowledged_points": unacked_points,
        "unacknowledged_stored": unacked_stored,
        "unexpected_points": unexpected,
        "api_mismatch": {str(k): v for k, v in sorted(mismatched.items())},
    }


# -- one backend -----------------------------------------------------------------------------
def run_backend(backend: str, args: argparse.Namespace, upgrade: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"trainhouse-bench-load-{backend}-"))
    server: LoadServer | None = None
    try:
        with contextlib.ExitStack() as stack:
            home = root / "home"
            db_url = stack.enter_context(scratch_pg(args.pg)) if backend == "postgresql" else None
            count_url = db_url or f"sqlite:///{home / 'trainhouse.db'}"
            server = start_server(home, db_url, max(128, args.clients), upgrade)
            stack.callback(server.stop)
            log(f"  server at {server.url}; submitting {args.clients} jobs ...")
            launches = submit_jobs(server, root, args.clients)
            wait_quiet(args.op_wait)
            log(f"  {args.clients} clients reporting for {args.duration:g} s ...")
            psutil.cpu_percent()  # start the machine-wide counter
            me = psutil.Process()
            cpu0, mine0 = server.cpu_seconds(), sum(me.cpu_times()[:2])
            results, start, end = asyncio.run(
                drive(
                    server.url,
                    launches,
                    args.series,
                    args.steps,
                    args.duration,
                    args.retry_for,
                )
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
        "clients": args.clients,
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


# -- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Concurrent metric reporting, PG vs SQLite.")
    parser.add_argument("--quick", action="store_true", help="10 s per backend")
    parser.add_argument("--clients", type=int, default=100, help="concurrent jobs (100)")
    parser.add_argument("--duration", type=float, help="seconds per backend (60; 10 --quick)")
    parser.add_argument("--series", type=int, default=10, help="series per request (10)")
    parser.add_argument("--steps", type=int, default=10, help="steps per request (10)")
    parser.add_argument("--db", choices=sorted(BACKENDS), default="both", help="(both)")
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL admin URL (%(default)s)")
    parser.add_argument(
        "--retry-for", type=float, default=30.0, help="retrying past the end, seconds (30)"
    )
    parser.add_argument(
        "--quiet-wait", type=float, help="seconds to wait for a quiet machine (30; 5 --quick)"
    )
    parser.add_argument(
        "--op-wait", type=float, help="the same before each backend's run (10; 2 --quick)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 10.0 if args.quick else 60.0
    quiet = args.quiet_wait if args.quiet_wait is not None else (5.0 if args.quick else 30.0)
    if args.op_wait is None:
        args.op_wait = min(quiet, 2.0 if args.quick else 10.0)
    if min(args.clients, args.series, args.steps) < 1 or args.duration <= 0:
        parser.error("--clients, --series, --steps must be >= 1 and --duration > 0")
    if args.series * args.steps > 200_000:
        parser.error("--series x --steps must be <= 200,000 (the server's limit per report)")

    busy = wait_quiet(quiet)
    upgrade = has_db_upgrade()
    log(f"trainhouse db upgrade: {'found, used' if upgrade else 'not in this trainhouse'}")
    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    for backend in BACKENDS[args.db]:
        log(f"{backend}:")
        try:
            runs.append(run_backend(backend, args, upgrade))
        except Exception as exc:  # the other backend still runs; the exit code says it failed
            problems.append(f"{backend}: not measured: {type(exc).__name__}: {exc}")
            log(problems[-1])
            continue
        r = runs[-1]
        log(f"  {r['points_per_s']:,.0f} points/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f}")
        problems += [f"{backend}: {p}" for p in failures(r)]
    by = {r["backend"]: r for r in runs}
    ratios = {}
    if "postgresql" in by and "sqlite" in by:
        pg, lite = by["postgresql"], by["sqlite"]
        ratios = {
            "points_per_s": pg["points_per_s"] / lite["points_per_s"],
            "p99": pg["p99_ms"] / lite["p99_ms"],
        }
    if args.json:
        print(
            json.dumps({"runs": runs, "ratios_pg_sqlite": ratios, "problems": problems}, indent=2)
        )
        return 1 if problems else 0

    print(
        f"metric reporting under load: {args.clients} clients x {args.duration:g} s per backend, "
        f"{args.series} series x {args.steps} steps = {args.series * args.steps} points per "
        "request"
    )
    head = (
        f"  {'backend':<11}{'clients':>8}{'requests':>10}{'points/s':>11}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}{'errors':>8}{'lost points':>13}"
    )
    print(head)
    for r in runs:
        print(
            f"  {r['backend']:<11}{r['clients']:>8}{r['requests']:>10,}{r['points_per_s']:>11,.0f}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}{r['errors']:>8}"
            f"{r['lost_points']:>13}"
        )
    if ratios:
        print(
            f"  PostgreSQL/SQLite: points/s {ratios['points_per_s']:.2f}, "
            f"p99 latency {ratios['p99']:.2f}"
        )
    for r in runs:
        print(
            f"  {r['backend']}: lost points: {r['lost_points']} ({r['acknowledged_points']:,} "
            f"acknowledged, {r['stored_points']:,} stored, {r['accepted_points']:,} accepted; "
            f"{r['unacknowledged_points']} in unacknowledged requests, "
            f"{r['unacknowledged_stored']} of them stored); requests per client "
            f"{r['requests_per_client_min']}-{r['requests_per_client_max']}; CPU: server "
            f"{1e6 * r['server_cpu_s'] / max(1, r['acknowledged_points']):.1f} us/point, "
            f"this client {100 * r['client_cpu_s'] / r['seconds']:.0f}% of a core, machine "
            f"{r['machine_cpu_percent']:.0f}%"
        )
        if r["errors"]:
            print(f"    {r['errors']} failed requests (retried), e.g. {r['error_samples'][:2]}")
        if r["server_log_errors"]:
            print(f"    the server logged {r['server_log_errors']} errors")
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
