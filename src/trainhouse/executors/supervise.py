"""Runs an attempt's launcher and records how it ended: ``python -m trainhouse.executors.supervise
EXIT_FILE COMMAND...``.

The local executor starts every attempt through this small process, the leader of the attempt's
session. It writes the launcher's exit code to ``EXIT_FILE`` as "CODE TIME" (negative: killed by
that signal), so a server that restarts while the attempt runs can re-adopt it and still learn its
result once it ends: the attempt is no longer the new server's child, so its exit status cannot be
waited for. SIGTERM and SIGINT are not forwarded: trainhouse signals the whole session, which
already reaches the launcher, and a second signal would cut the launcher's own clean-up short.

It is non-dumpable: the attempt's processes, which run as the same user, cannot read its
environment or memory. Imports the standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainhouse import _hardening

MODULE = "trainhouse.executors.supervise"


def record(path: Path, code: int) -> None:
    """Write "CODE TIME" to ``path`` atomically (a reader never sees half a line)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(f"{code} {time.time():.6f}")
        os.replace(tmp, path)
    except OSError:
        pass


def read_record(path: Path) -> tuple[int, float | None] | None:
    """The (code, time) ``record`` wrote, or None when there is none (yet)."""
    try:
        code_text, _, time_text = path.read_text().strip().partition(" ")
        return int(code_text), float(time_text) if time_text else None
    except (OSError, ValueError):
        return None


def supervised(cmdline: list[str]) -> Path | None:
    """The exit file of a supervisor's command line, as ``/proc/<pid>/cmdline`` shows it to
    anyone; None if it is not a supervisor's."""
    if len(cmdline) < 4 or cmdline[1:3] != ["-m", MODULE]:
        return None
    return Path(cmdline[3])


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(f"usage: python -m {MODULE} EXIT_FILE COMMAND [ARGS...]", file=sys.stderr)
        return 2
    exit_file = Path(argv[0])
    _hardening.no_dump()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: None)
    try:
        child = subprocess.Popen(argv[1:], stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"trainhouse: cannot start {argv[1]!r}: {exc}", file=sys.stderr)
        code = 127
    else:
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
                continue
    record(exit_file, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
