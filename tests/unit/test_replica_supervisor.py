"""A service's rank supervises its replica (``trainhouse.serving.supervisor``), run here as
the rank runs it, in a process of its own, over real child processes: a child that dies is
started again alone (the supervisor stays), a stop is passed on and ends the restarts, and a
child that keeps failing is given up on past the bounded restarts (the rank fails, so the job's
own restart applies)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import os, signal, sys, time
log = sys.argv[1]
with open(log, "a") as fh:
    fh.write(f"start {os.getpid()}\\n")
if sys.argv[2] == "crash":
    sys.exit(3)
def stop(signum, frame):
    with open(log, "a") as fh:
        fh.write(f"stop {os.getpid()} {signum}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.05)
"""


def start(tmp_path: Path, mode: str, **kw: float) -> tuple[subprocess.Popen[str], Path]:
    """The supervisor of a child in ``mode`` (``crash``: exits 3 at once; ``serve``: runs
    until SIGTERM), in a process of its own; the child's log of what it did."""
    log = tmp_path / "child.log"
    child = [sys.executable, "-c", CHILD, str(log), mode]
    options = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    driver = (
        "import sys\nfrom trainhouse.serving.supervisor import supervise\n"
        f"sys.exit(supervise({child!r}, {options}))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, log


def lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(log: Path, count: int) -> list[list[str]]:
    deadline = time.monotonic() + 30
    while len(found := [e for e in lines(log) if e[0] == "start"]) < count:
        assert time.monotonic() < deadline, lines(log)
        time.sleep(0.02)
    return found


def test_a_dead_replica_is_started_again_alone_and_a_stop_ends_it(tmp_path: Path) -> None:
    proc, log = start(tmp_path, "serve", first_pause=0.05)
    try:
        first = wait_for(log, 1)[0][1]
        os.kill(int(first), signal.SIGKILL)
        second = wait_for(log, 2)[1][1]
        assert second != first
        assert proc.poll() is None  # the rank's own process never ended
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # the replica stopped cleanly, and so did the rank
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lines(log) == [
        ["start", first],
        ["start", second],
        ["stop", second, str(int(signal.SIGTERM))],
    ]
    out = proc.stdout.read() if proc.stdout else ""
    assert f"its process {first} was killed by signal 9; restarting it" in out, out


def test_a_replica_that_keeps_failing_fails_its_rank_past_the_restarts(tmp_path: Path) -> None:
    proc, log = start(tmp_path, "crash", restarts=2, window=60.0, first_pause=0.01)
    assert proc.wait(30) == 3  # the child's code: the job's restart applies
    assert len({e[1] for e in lines(log)}) == 3  # started, then restarted twice
    out = proc.stdout.read() if proc.stdout else ""
    assert out.count("exited with code 3; restarting it") == 2, out
    assert "2 restarts in 60 s already, so the replica fails" in out, out


def test_a_stop_while_it_waits_to_restart_is_not_delayed_by_the_pause(tmp_path: Path) -> None:
    proc, log = start(tmp_path, "crash", first_pause=600.0, longest_pause=600.0)
    try:
        wait_for(log, 1)
        assert proc.stdout is not None
        assert "restarting it in 600 s" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(lines(log)) == 1  # never started again
