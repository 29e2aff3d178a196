"""Finding every process of an attempt (standard library and psutil).

Every process of an attempt carries ``TRAINHOUSE_RUN_MARKER`` (:data:`trainhouse.layout.MARKER_ENV`)
in its environment: torchrun puts each rank in a session of its own, so a process-group signal
does not reach them all, but a scan for the marker does. Shared by the local executor and the
Ray node agent.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from trainhouse.layout import MARKER_ENV

__all__ = ["find_marked", "kill_marked", "marked_pids", "signal_all"]


def find_marked(marker: str) -> list[psutil.Process]:
    """Every live process of this machine whose environment carries ``marker``."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def marked_pids() -> dict[str, list[int]]:
    """Marker -> PIDs of every live process carrying one: one scan for all attempts."""
    found: dict[str, list[int]] = {}
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            marker = proc.environ().get(MARKER_ENV)
        except (psutil.Error, OSError):
            continue
        if marker:
            found.setdefault(marker, []).append(proc.pid)
    return found


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.send_signal(sig)


def kill_marked(marker: str, sig: int = signal.SIGKILL) -> int:
    """``sig`` to every process carrying ``marker`` (waiting for them after SIGKILL); how many."""
    procs = find_marked(marker)
    signal_all(procs, sig)
    if sig == signal.SIGKILL and procs:
        psutil.wait_procs(procs, timeout=5)
    return len(procs)
