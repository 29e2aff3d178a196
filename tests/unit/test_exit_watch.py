"""The local executor learns of an attempt's end when its supervisor exits, not at a poll."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from trainhouse.executors.local import watch_exit


def test_the_callback_comes_when_the_process_ends_and_not_before() -> None:
    ended = threading.Event()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert watch_exit(proc.pid, ended.set)
        assert not ended.wait(0.3)  # still running
        assert proc.stdin is not None
        proc.stdin.close()
        began = time.monotonic()
        assert ended.wait(10)
        assert time.monotonic() - began < 2
        assert proc.poll() is not None or proc.wait(5) == 0  # still ours to reap
    finally:
        proc.kill()
        proc.wait()
