"""Runs an attempt's launcher and records how it ended: ``python -m trainhouse.executors.supervise
EXIT_FILE COMMAND...``.

The local executor starts every attempt through this small process, the leader of the attempt's
session. It writes the launcher's exit code to ``EXIT_FILE`` as "CODE TIME" (negative: killed by
that signal), so a server that restarts while the attempt runs can re-adopt it and still learn its
result once it ends: the attempt is no longer the new server's child, so its exit status cannot be
waited for. SIGTERM and SIGINT are not forwarded: trainhouse signals the whole session, which
already reaches the launcher, and a second signal would cut the launcher's own clean-up short.
The job's processes can replace an exit record, so :func:`read_record` reads it through
:mod:`trainhouse.jobfiles`. Imports the standard library and that module only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainhouse import jobfiles

#: an exit record is "CODE TIME": a longer one is not read
MAX_EXIT_RECORD = 4096


def record(path: Path, code: int) -> None:
    """Write "CODE TIME" to ``path`` atomically (a reader never sees half a line)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(f"{code} {time.time():.6f}")
        os.replace(tmp, path)
    except OSError:
        pass


def read_record(path: Path, *, within: Path) -> tuple[int, float | None] | None:
    """The (code, time) ``record`` wrote, or None when there is none (yet), or when it is not
    a small regular file reached from ``within`` (the directory above the attempt's that the
    job cannot replace) without a link."""
    try:
        text = jobfiles.read_file(within, path, max_size=MAX_EXIT_RECORD).decode()
        code_text, _, time_text = text.strip().partition(" ")
        return int(code_text), float(time_text) if time_text else None
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(
            "usage: python -m trainhouse.executors.supervise EXIT_FILE COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    exit_file = Path(argv[0])
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
