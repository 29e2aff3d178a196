"""Processes a test session's servers started for their jobs (the leak check and the fault
tests find them by their marker)."""

from __future__ import annotations

import contextlib
import tempfile

import psutil

from trainhouse.layout import MARKER_ENV


def marked_processes() -> list[psutil.Process]:
    """Processes a trainhouse executor started for this test session's servers.

    They carry TRAINHOUSE_RUN_MARKER, and their job directory lies under the session's temp
    directory (tests/conftest.py points TMPDIR there), so jobs of other trainhouse servers on
    the machine are not counted.
    """
    session_tmp = tempfile.gettempdir()
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            env = proc.environ()
            if MARKER_ENV in env and env.get("TRAINHOUSE_LOG_DIR", "").startswith(session_tmp):
                found.append(proc)
    return found
