"""Per-attempt cgroups (cgroup v2), where the machine lets the server make them (standard
library only: the supervisor imports this).

An attempt's cgroup is ``<the server's cgroup>/trainhouse-<home>-<job>-<attempt>``. The
supervisor puts the launcher in it before the launcher runs, so every process the attempt ever
starts is in it, whatever it does to its session, parent or environment (a process can only
leave by writing to ``cgroup.procs`` itself): ``cgroup.procs`` lists them for the resource
monitor, and ``cgroup.kill`` ends them all at once. The supervisor itself stays outside, so that
it outlives a ``cgroup.kill`` and still records the launcher's end.

:func:`attempt_root` says whether this machine allows it: a cgroup v2 hierarchy is mounted, the
server's own cgroup in it is writable (root, or a delegated subtree: systemd's ``Delegate=yes``),
and the kernel has ``cgroup.kill`` (Linux 5.14). Otherwise there are no cgroups, and the
executor relies on the supervisor (a child subreaper) and the marker alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

__all__ = [
    "PREFIX",
    "attempt_root",
    "enter",
    "kill",
    "mount_point",
    "own_cgroup",
    "procs",
    "remove",
]

PREFIX = "trainhouse-"  # the name of every attempt's cgroup starts with it
_ESCAPE = re.compile(r"\\([0-7]{3})")


def mount_point(mountinfo: str = "/proc/self/mountinfo") -> tuple[Path, str] | None:
    """Where the cgroup v2 hierarchy is mounted, and which of its cgroups that mount shows at
    its top ("/" unless a subtree was bind-mounted); None when it is not mounted."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep + 1 < len(fields) and fields[sep + 1] == "cgroup2" and len(fields) > 4:
            root, where = (_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[3:5])
            return Path(where), root
    return None


def own_cgroup(pid: int | str = "self") -> str | None:
    """The cgroup v2 path of process ``pid`` (``/proc/<pid>/cgroup``'s "0::" line)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def _directory(cgroup: str) -> Path | None:
    """The directory of ``cgroup`` under the v2 mount, None if it is not reachable there."""
    mounted = mount_point()
    if mounted is None:
        return None
    where, top = mounted
    if cgroup.endswith(" (deleted)"):
        return None
    top = top.rstrip("/")
    if top and cgroup != top and not cgroup.startswith(top + "/"):
        return None
    return where / cgroup[len(top) :].lstrip("/")


def attempt_root() -> tuple[Path | None, str]:
    """The directory under which attempts' cgroups go (this process's own cgroup), or None,
    and a sentence saying which, or why not."""
    cgroup = own_cgroup()
    if cgroup is None:
        return None, "no cgroup v2 hierarchy is mounted"
    root = _directory(cgroup)
    if root is None or not (root / "cgroup.procs").is_file():
        return None, f"the server's cgroup {cgroup} is not in a mounted cgroup v2 hierarchy"
    if not os.access(root / "cgroup.procs", os.W_OK):
        return None, (
            f"the server's cgroup {root} is not writable by its user (with systemd: "
            "Delegate=yes in the unit)"
        )
    probe = root / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
    except OSError as exc:
        return None, f"cannot create cgroups in {root}: {exc.strerror or exc}"
    try:
        if not (probe / "cgroup.kill").is_file():
            return None, "the kernel has no cgroup.kill (Linux 5.14 or later has)"
        if not os.access(probe / "cgroup.procs", os.W_OK):
            return None, f"cgroups created in {root} are not writable"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return root, f"every attempt gets a cgroup under {root}"


def enter(path: Path) -> None:
    """Move the calling process into the cgroup ``path``."""
    (path / "cgroup.procs").write_text("0")


def _tree(path: Path) -> list[Path]:
    """``path`` and every cgroup below it, the deepest first."""
    found = []
    for dirpath, _dirs, _files in os.walk(path):
        found.append(Path(dirpath))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def procs(path: Path) -> list[int]:
    """Every process in the cgroup ``path`` and in the cgroups a job made below it."""
    pids: list[int] = []
    for cgroup in _tree(path):
        with contextlib.suppress(OSError, ValueError):
            pids.extend(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    return pids


def kill(path: Path, sig: int = signal.SIGKILL) -> int:
    """``sig`` to every process in the cgroup ``path`` (SIGKILL through ``cgroup.kill``, which
    no fork can race); how many there were."""
    pids = procs(path)
    if sig == signal.SIGKILL:
        try:
            (path / "cgroup.kill").write_text("1")
            return len(pids)
        except OSError:
            pass
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    return len(pids)


def remove(path: Path, timeout: float = 5.0) -> bool:
    """Remove the cgroup ``path`` (and those below it) once its processes are gone; False if
    some are still there after ``timeout`` seconds, or it cannot be removed."""
    deadline = time.monotonic() + timeout
    while True:
        gone = True
        for cgroup in _tree(path):
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        if gone or time.monotonic() > deadline:
            return gone
        time.sleep(0.05)
