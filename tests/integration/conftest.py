"""A real ``trainhouse server`` subprocess on a free port in a temp home, and CLI helpers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainhouse.client import Client
from trainhouse.server.process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "trainhouse.yaml"


class Server(ServerProcess):
    """A real server subprocess plus helpers to drive it as a user would."""

    @property
    def client(self) -> Client:
        return Client(self.url)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``trainhouse ARGS`` against this server, as a user would."""
        return subprocess.run(
            [sys.executable, "-m", "trainhouse", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env={**os.environ, "TRAINHOUSE_URL": self.url, "COLUMNS": "200"},
        )

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
