"""A real ``trainhouse server`` subprocess on a free port in a temp home, and CLI helpers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trainhouse.client import Client
from trainhouse.errors import ServerUnreachable

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "trainhouse.yaml"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str
    home: Path
    proc: subprocess.Popen[bytes]
    log: Path

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

    def wait(self, job_id: int, states: set[str], timeout: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.client as c:
            while time.monotonic() < deadline:
                job = c.job(job_id)
                if job["state"] in states:
                    return job
                time.sleep(0.3)
        raise AssertionError(f"job {job_id} still {job['state']} after {timeout}s: {job}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(home: Path, *args: str) -> Server:
    port = free_port()
    log = home.parent / f"{home.name}-server.log"
    home.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainhouse",
                "server",
                "--port",
                str(port),
                "--home",
                str(home),
                *args,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Server(f"http://127.0.0.1:{port}", home, proc, log)
    deadline = time.monotonic() + 60
    with Client(server.url) as c:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited {proc.returncode}: {log.read_text()}")
            try:
                c.health()
                break
            except ServerUnreachable:
                if time.monotonic() > deadline:
                    server.stop()
                    raise AssertionError(f"server did not start: {log.read_text()}") from None
                time.sleep(0.2)
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
    log = srv.log.read_text()
    assert code in (0, -signal.SIGTERM), f"server exited {code}: {log[-3000:]}"
    assert "Application shutdown complete" in log, log[-3000:]
