"""A ``trainhouse server`` in a child process, started and watched from the client side: what
``trainhouse demo``, the tests and the benchmarks start. It talks to the server only over HTTP
(:class:`~trainhouse.client.Client`) and imports nothing of the server itself."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Self

from trainhouse.client import Client
from trainhouse.core.errors import ServerStartError, ServerUnreachable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """Start with :meth:`start` (returns once the server answers), end with :meth:`stop`."""

    def __init__(self, home: Path, port: int, *args: str, log: Path | None = None) -> None:
        self.home = home
        self.port = port
        self.args = args
        self.log = log or home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # in a session of its own, a terminal's Ctrl-C reaches only the process that started
        # it, which then stops the server with SIGTERM (what ``demo`` wants)
        self.own_session = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line (a subclass may run another entry point)."""
        return [
            sys.executable,
            "-m",
            "trainhouse",
            "server",
            "--port",
            str(self.port),
            "--home",
            str(self.home),
            *self.args,
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "TRAINHOUSE_HOME": str(self.home)}

    def stdin(self) -> int | IO[bytes]:
        """What the server reads on standard input: nothing (a subclass may hand it a file,
        for ``--db-file -``)."""
        return subprocess.DEVNULL

    def start(self, *, timeout: float = 120) -> Self:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)  # as the server makes it
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=self.stdin(),
                env=self.environment(),
                start_new_session=self.own_session,
            )
        deadline = time.monotonic() + timeout
        with Client(self.url) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"the server exited with code {self.proc.returncode}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(ServerUnreachable):
                    client.health()
                    return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"the server did not answer within {timeout:.0f} s; see {self.log}"
                    )
                time.sleep(0.2)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait(self) -> int | None:
        """Block until the server exits (a Ctrl-C raises KeyboardInterrupt here); its exit
        code, or None if it never started."""
        return None if self.proc is None else self.proc.wait()

    def stop(self, *, timeout: float = 60) -> int | None:
        """SIGTERM (the server stops its jobs and requeues them), SIGKILL past ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
