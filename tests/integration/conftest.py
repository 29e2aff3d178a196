"""A real ``trainhouse server`` subprocess on a free port in a temp home, and CLI helpers.

Every test that starts a server runs twice, on each database backend (ids ``[sqlite]`` and
``[postgresql]``): with the embedded SQLite in the server's home, and with a fresh database on
the real PostgreSQL (one per server home, so a restarted server finds its state), upgraded by
``trainhouse db upgrade`` as an operator would and dropped after the test, pass or fail.
``SINGLE_BACKEND`` lists the tests that run on one backend only, and why; a test that asks
for the ``backend`` fixture by name runs on both too.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import psycopg
import pytest

from tests.conftest import PG_ADMIN
from trainhouse.client import Client
from trainhouse.serverprocess import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "trainhouse.yaml"

# TRAINHOUSE_TEST_BACKENDS=sqlite runs the server tests on one backend only (a quick local run)
BACKENDS = tuple(os.environ.get("TRAINHOUSE_TEST_BACKENDS", "sqlite,postgresql").split(","))

# tests that start servers but run on one backend only (nodeid suffix: why)
SINGLE_BACKEND = {
    "test_ray.py": "Ray: a module-wide cluster and server; the executor, not the store, is "
    "under test, and each test costs tens of seconds",
    "test_recovery.py::test_demo_runs_end_to_end": "the demo is the embedded SQLite quick start",
    "test_chaos.py": "random SIGKILLs of ranks, launchers and the server: the processes are under "
    "test; the store's side of a killed server (re-adoption, lost attempts, spooled metrics) "
    "runs on both backends in test_recovery.py, and chaos is the suite's most expensive test",
    "test_training.py::test_postgres_backed_server": "picks its own PostgreSQL database",
    "test_postgres.py::test_a_server_refuses_an_unmigrated": "an unmigrated PostgreSQL database",
}


def pg_url_of(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}"


def run_trainhouse(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``trainhouse ARGS`` in a child process, as a person or an operator runs it; ``env`` is
    added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "trainhouse", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        input=stdin,
    )


def db_upgrade(url: str) -> None:
    result = run_trainhouse("db", "upgrade", "--db", url)
    assert result.returncode == 0, f"trainhouse db upgrade failed: {result.stderr}{result.stdout}"


class Databases:
    """The databases one test's servers use: SQLite in each server's home, or on PostgreSQL a
    fresh database per server home (created and upgraded on first use, dropped by
    :meth:`drop`)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.by_home: dict[Path, str] = {}
        self.created: list[str] = []
        self.upgraded: set[str] = set()

    def url_for(self, home: Path) -> str | None:
        """The ``--db`` URL of a server in ``home`` (None: the SQLite default)."""
        if self.backend == "sqlite":
            return None
        key = home.resolve()
        if key not in self.by_home:
            name = f"trainhouse_it_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            self.created.append(name)
            self.by_home[key] = pg_url_of(name)
        return self.by_home[key]

    def ensure_upgraded(self, url: str) -> None:
        """Run ``trainhouse db upgrade`` once on a PostgreSQL database a server is pointed at."""
        if url.startswith("postgresql") and url not in self.upgraded:
            db_upgrade(url)
            self.upgraded.add(url)

    def drop(self) -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()


_databases = Databases("sqlite")  # the running test's; the autouse `backend` fixture sets it


def _single_backend(nodeid: str) -> bool:
    return any(nodeid.split("/")[-1].startswith(key) for key in SINGLE_BACKEND)


def database_of(home: Path) -> str:
    """The URL of the database servers in ``home`` use in the running test (not upgraded)."""
    return _databases.url_for(home) or f"sqlite:///{home / 'trainhouse.db'}"


def _starts_a_server(metafunc: pytest.Metafunc) -> bool:
    if "backend" in inspect.signature(metafunc.function).parameters:
        return True  # asks for the backend itself
    if any(name.endswith("server") and name != "pg_server" for name in metafunc.fixturenames):
        return True
    try:
        source = inspect.getsource(metafunc.function)
    except (OSError, TypeError):
        return False
    return re.search(r"\b(start_server|Server)\(", source) is not None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that starts a server runs on SQLite and on PostgreSQL, but those in
    SINGLE_BACKEND."""
    if "backend" not in metafunc.fixturenames or "pg_url" in metafunc.fixturenames:
        return
    if _starts_a_server(metafunc) and not _single_backend(metafunc.definition.nodeid):
        metafunc.parametrize("backend", BACKENDS, indirect=True, ids=BACKENDS)


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database backend of the test's servers (SQLite unless parametrized)."""
    global _databases
    name: str = getattr(request, "param", "sqlite")
    if name == "postgresql":
        request.getfixturevalue("pg_server")  # a clear failure when PostgreSQL is not there
    previous, _databases = _databases, Databases(name)
    try:
        yield name
    finally:
        dbs, _databases = _databases, previous
        dbs.drop()


class Server(ServerProcess):
    """A real server subprocess plus helpers to drive it as a user would.

    Unless ``--db`` is given, it uses the running test's backend: SQLite in ``home``, or the
    PostgreSQL database of ``home`` (the same one for a server restarted there). A PostgreSQL
    database is upgraded with ``trainhouse db upgrade`` before the first server starts on it.
    """

    def __init__(self, home: Path, port: int, *args: str, log: Path | None = None) -> None:
        if "--db" not in args:
            url = _databases.url_for(home)
            if url is not None:
                args = (*args, "--db", url)
        super().__init__(home, port, *args, log=log)

    @property
    def db_url(self) -> str:
        """The database this server uses."""
        if "--db" in self.args:
            return self.args[self.args.index("--db") + 1]
        return f"sqlite:///{self.home / 'trainhouse.db'}"

    def start(self, *, timeout: float = 120) -> Self:
        _databases.ensure_upgraded(self.db_url)
        super().start(timeout=timeout)
        return self

    @property
    def client(self) -> Client:
        return Client(self.url)

    def cli(
        self,
        *args: str,
        timeout: float = 300,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``trainhouse ARGS`` against this server, as a user would (``env``: e.g. their
        TRAINHOUSE_TOKEN or TRAINHOUSE_CONFIG_DIR)."""
        return run_trainhouse(
            *args, timeout=timeout, env={"TRAINHOUSE_URL": self.url, **(env or {})}, stdin=stdin
        )

    def admin_token(self, name: str = "admin") -> str:
        """``trainhouse admin init`` on this server's database: the first admin's token."""
        result = self.cli(
            "admin",
            "init",
            "--name",
            name,
            "--home",
            str(self.home),
            "--db",
            self.db_url,
            "--json",
            timeout=120,
        )
        assert result.returncode == 0, result.stderr + result.stdout
        return str(json.loads(result.stdout)["secret"])

    def cli_json(self, *args: str, timeout: float = 300) -> Any:
        result = self.cli(*args, "--json", timeout=timeout)
        assert result.returncode == 0, result.stderr + result.stdout
        return json.loads(result.stdout)

    def wait_step(self, job_id: int, step: int, timeout: float = 120) -> dict[str, Any]:
        """Wait until the job has reported ``step`` (it is training, not just starting)."""
        deadline = time.monotonic() + timeout
        with self.client as c:
            while True:
                job = c.job(job_id)
                if (job.get("last_step") or 0) >= step:
                    return job
                assert time.monotonic() < deadline, f"job {job_id} never reached step {step}"
                time.sleep(0.2)

    def wait(self, job_id: int, states: set[str], timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.client as c:
            while time.monotonic() < deadline:
                job = c.job(job_id)
                if job["state"] in states:
                    return job
                time.sleep(0.3)
        raise AssertionError(f"job {job_id} still {job['state']} after {timeout}s: {job}")


def start_server(home: Path, *args: str, port: int | None = None) -> Server:
    """A server on ``port`` (a restarted one keeps its address: running jobs report to it)."""
    server = Server(home, port or free_port(), *args, log=home.parent / f"{home.name}-server.log")
    server.start(timeout=60)
    return server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", "--cpus", "4")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def assert_clean_stop(srv: Server) -> None:
    """SIGTERM ends the server gracefully (uvicorn re-raises the signal after shutdown)."""
    code = srv.stop()
    log = srv.log_tail(100_000)
    assert code in (0, -signal.SIGTERM), f"server exited {code}: {log[-3000:]}"
    assert "Application shutdown complete" in log, log[-3000:]
