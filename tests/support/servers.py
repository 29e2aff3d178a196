"""A real ``trainhouse server`` subprocess on a free port in a temp home, and CLI helpers.

A :class:`Server` uses the running test's database backend (tests/integration/conftest.py
parametrizes the tests that start servers over SQLite and PostgreSQL): SQLite in its home, or
a fresh PostgreSQL database per server home, upgraded by ``trainhouse db upgrade`` as an
operator would, and dropped after the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Self

from tests.support.postgres import create_database, drop_database, pg_url_of
from tests.support.processes import unprivileged
from trainhouse.client import Client
from trainhouse.client.serverprocess import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "trainhouse.yaml"


def example_module() -> ModuleType:
    """The digits example's ``train.py`` imported (its datasets and its model class)."""
    spec = importlib.util.spec_from_file_location("digits_train", EXAMPLE.parent / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
            name = create_database("trainhouse_it")
            self.created.append(name)
            self.by_home[key] = pg_url_of(name)
        return self.by_home[key]

    def ensure_upgraded(self, url: str) -> None:
        """Run ``trainhouse db upgrade`` once on a PostgreSQL database a server is pointed at."""
        if url.startswith("postgresql") and url not in self.upgraded:
            db_upgrade(url)
            self.upgraded.add(url)

    def drop(self) -> None:
        for name in self.created:
            drop_database(name)
        self.created.clear()


class _Current:
    """The running test's databases (the integration tier's autouse ``backend`` fixture sets
    them with :func:`use_databases`)."""

    databases = Databases("sqlite")


def use_databases(databases: Databases) -> Databases:
    """Make ``databases`` the running test's; returns the ones it replaces."""
    previous, _Current.databases = _Current.databases, databases
    return previous


def database_of(home: Path) -> str:
    """The URL of the database servers in ``home`` use in the running test (not upgraded)."""
    return _Current.databases.url_for(home) or f"sqlite:///{home / 'trainhouse.db'}"


class Server(ServerProcess):
    """A real server subprocess plus helpers to drive it as a user would.

    Unless ``--db`` is given, it uses the running test's backend: SQLite in ``home``, or the
    PostgreSQL database of ``home`` (the same one for a server restarted there). A PostgreSQL
    database is upgraded with ``trainhouse db upgrade`` before the first server starts on it.
    """

    def __init__(self, home: Path, port: int, *args: str, log: Path | None = None) -> None:
        if "--db" not in args:
            url = _Current.databases.url_for(home)
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
        _Current.databases.ensure_upgraded(self.db_url)
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


class UnprivilegedServer(Server):
    """A server run as an ordinary user's would be (:func:`unprivileged`: it and its jobs
    cannot read other processes' environment and memory nor other users' files) in
    ``cgroup`` (None: the test's), with ``env`` added to its environment and ``stdin`` (a file
    the test opens) as its standard input."""

    def __init__(
        self,
        home: Path,
        port: int,
        *args: str,
        env: dict[str, str] | None = None,
        stdin: Path | None = None,
        cgroup: Path | None = None,
    ) -> None:
        super().__init__(home, port, *args, log=home.parent / f"{home.name}-server.log")
        self.env = env or {}
        self.stdin_file = stdin
        self.cgroup = cgroup
        self._stdin: IO[bytes] | None = None

    def command(self) -> list[str]:
        return unprivileged(super().command(), cgroup=self.cgroup)

    def environment(self) -> dict[str, str]:
        return {**super().environment(), **self.env}

    def stdin(self) -> int | IO[bytes]:
        return self._stdin if self._stdin is not None else super().stdin()

    def start(self, *, timeout: float = 120) -> Self:
        # opened here, with the test's privileges (as systemd opens StandardInput=file:)
        self._stdin = self.stdin_file.open("rb") if self.stdin_file is not None else None
        try:
            return super().start(timeout=timeout)
        finally:
            if self._stdin is not None:
                self._stdin.close()
                self._stdin = None


def start_server(home: Path, *args: str, port: int | None = None) -> Server:
    """A server on ``port`` (a restarted one keeps its address: running jobs report to it)."""
    server = Server(home, port or free_port(), *args, log=home.parent / f"{home.name}-server.log")
    server.start(timeout=60)
    return server


def assert_clean_stop(srv: Server) -> None:
    """SIGTERM ends the server gracefully (uvicorn re-raises the signal after shutdown)."""
    code = srv.stop()
    log = srv.log_tail(100_000)
    assert code in (0, -signal.SIGTERM), f"server exited {code}: {log[-3000:]}"
    assert "Application shutdown complete" in log, log[-3000:]


def run_cli(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """``trainhouse ARGS`` in a child process (against ``url``), its output captured."""
    env = {**os.environ, "COLUMNS": "200"}
    if url:
        env["TRAINHOUSE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "trainhouse", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
