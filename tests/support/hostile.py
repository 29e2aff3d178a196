"""What a hostile job leaves behind, and how a test survives code that falls for it.

A FIFO blocks whoever opens it until the other end is opened; code that falls for one never
returns. :class:`Fifos` makes them and, when a test ends (or asks), lets go of every open that
still waits on one, so that a test of the unfixed code fails instead of hanging. :func:`finishes`
runs a call on a thread of its own and says whether it returned within a time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Fifos:
    """FIFOs made by a test; :meth:`release` wakes whatever waits in an open of one."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def make(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        self.paths.append(path)
        return path

    def release(self, quiet_for: float = 0.5, at_most: float = 10.0) -> None:
        """Open and close the other end of every FIFO until nobody has waited on one for
        ``quiet_for`` seconds: a reader blocked in ``open`` reads EOF, a writer writes into a
        pipe that is closed (EPIPE)."""
        deadline = time.monotonic() + at_most
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_for:
            for path in self.paths:
                with contextlib.suppress(OSError):
                    if not stat.S_ISFIFO(os.lstat(path).st_mode):
                        continue  # replaced (by the code under test): nothing waits on it
                for flags in (os.O_WRONLY, os.O_RDONLY):
                    try:
                        fd = os.open(path, flags | os.O_NONBLOCK)
                    except OSError as exc:
                        if exc.errno not in (errno.ENXIO, errno.ENOENT):
                            raise
                        continue
                    if flags == os.O_WRONLY:  # a reader was waiting
                        quiet_since = time.monotonic()
                    os.close(fd)
            time.sleep(0.02)


def finishes(call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """(True, what ``call`` returned) when it returned within ``timeout`` seconds, else
    (False, None); an exception it raised is re-raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="hostile-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no room on disk (one hole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def socket_file(path: Path) -> Path:
    """A Unix socket's entry at ``path`` (nothing listens on it); bound under a short name
    (a socket's path has at most 107 bytes) and moved there."""
    import socket
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp())  # the same filesystem as the tests' tmp_path
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s"))
        os.replace(short / "s", path)
    finally:
        short.rmdir()
    return path


@contextlib.contextmanager
def released(fifos: Fifos) -> Any:
    """Release ``fifos`` when the block ends, however it ends (before the app shuts down)."""
    try:
        yield fifos
    finally:
        fifos.release()
