"""Processes a test session's servers started for their jobs (the leak check and the fault
tests find them by their marker), and running a process as an ordinary user would be."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import psutil

from trainhouse.jobfs.layout import MARKER_ENV

_SESSION_ROOTS: list[str] = []


def add_session_root(path: Path | str) -> None:
    """Count jobs whose directory lies under ``path`` as this session's too: pytest's own
    ``tmp_path`` root, which under pytest-xdist is the controller's, one folder per worker,
    outside the worker's TMPDIR (tests/conftest.py registers it)."""
    root = os.path.join(os.path.realpath(path), "")
    if root not in _SESSION_ROOTS:
        _SESSION_ROOTS.append(root)


def marked_processes() -> list[psutil.Process]:
    """Processes a trainhouse executor started for this test session's servers.

    They carry TRAINHOUSE_RUN_MARKER, and their job directory lies under the session's temp
    directory (tests/conftest.py points TMPDIR there) or pytest's temp root for this session
    (its worker's, under pytest-xdist), so jobs of other trainhouse servers on the machine, and
    of the other workers of the same run, are not counted.
    """
    roots = (os.path.join(os.path.realpath(tempfile.gettempdir()), ""), *_SESSION_ROOTS)
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            log_dir = os.path.realpath(env.get("TRAINHOUSE_LOG_DIR", "/nonexistent"))
            if MARKER_ENV in env and log_dir.startswith(roots):
                found.append(proc)
    return found


_UNPRIVILEGED = """
import ctypes, os, sys
if sys.argv[1]:
    with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
libc = ctypes.CDLL(None)
with open("/proc/sys/kernel/cap_last_cap") as fh:
    last = int(fh.read())
for cap in range(last + 1):
    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: refused, and harmless, when not root
os.execv(sys.argv[2], sys.argv[2:])
"""


def unprivileged(command: list[str], *, cgroup: Path | None = None) -> list[str]:
    """``command`` run as an ordinary user's process, first moved into ``cgroup`` (as systemd
    starts a unit). The suite runs as root in a container: root without any capability is,
    to the kernel, any other user (it reads no non-dumpable process's environment, no file
    whose mode shuts out everyone but its owner unless it owns it). Run by an ordinary user,
    nothing changes."""
    return [sys.executable, "-c", _UNPRIVILEGED, str(cgroup or ""), *command]


def effective_caps(pid: int) -> int:
    """The effective capability set of process ``pid`` (a bit per capability)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff in /proc/{pid}/status")


def bare_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a script run outside any server (bare ``torchrun``): no
    ``TRAINHOUSE_*`` or rank variables inherited, scratch files in ``tmp_path``, this
    checkout's trainhouse on the path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINHOUSE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env.update(
        TMPDIR=str(tmp_path),  # torchrun's and torch's scratch files stay in the test's dir
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"),
    )
    return env
