"""Finding every process of an attempt (standard library and psutil).

Every process of an attempt carries ``TRAINHOUSE_RUN_MARKER``
(:data:`trainhouse.jobfs.layout.MARKER_ENV`) in its environment: torchrun puts each rank in a
session of its own, so a process-group signal does not reach them all, but a scan for the marker
does. A process that drops the marker (a daemon that re-executed itself with a clean environment) is
still a descendant of the attempt's supervisor, a child subreaper: :func:`scan` also returns every
process's parent, and :func:`descendants` the tree under a PID. Environments of non-dumpable
processes (the server, the supervisors) cannot be read by their own user: they are found by PID and
parentage instead. Shared by the local executor and the Ray node agent.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

import psutil

from trainhouse.jobfs.layout import MARKER_ENV

__all__ = [
    "Scan",
    "descendants",
    "find_marked",
    "kill_marked",
    "marked_pids",
    "processes",
    "scan",
    "signal_all",
]


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
    return scan().marked


@dataclass(frozen=True)
class Scan:
    """One look at every process: who carries which marker, and every process's parent."""

    marked: dict[str, list[int]]
    parents: dict[int, int]

    def of(self, marker: str, root: int | None = None) -> list[int]:
        """The processes carrying ``marker`` and, with ``root``, ``root`` and every process
        under it."""
        pids = dict.fromkeys(self.marked.get(marker, []))
        if root is not None and root in self.parents:
            pids.update(dict.fromkeys([root, *descendants(self.parents, root)]))
        return list(pids)


def scan() -> Scan:
    """Every live process's marker (those that have one and whose environment can be read)
    and parent, in one pass over the machine's processes."""
    marked: dict[str, list[int]] = {}
    parents: dict[int, int] = {}
    me = os.getpid()
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            parents[proc.pid] = ppid
        if proc.pid == me:
            continue
        try:
            marker = proc.environ().get(MARKER_ENV)
        except (psutil.Error, OSError):
            continue
        if marker:
            marked.setdefault(marker, []).append(proc.pid)
    return Scan(marked, parents)


def descendants(parents: dict[int, int], root: int) -> list[int]:
    """Every process under ``root`` in the parent map ``parents``."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        if pid != ppid:
            children.setdefault(ppid, []).append(pid)
    found: dict[int, None] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found[pid] = None
        todo.extend(children.get(pid, []))
    return list(found)


def processes(pids: list[int]) -> list[psutil.Process]:
    """The psutil handles of ``pids`` that are still alive."""
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


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
