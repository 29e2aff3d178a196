"""The rank wrapper (trainhouse.executors.node.rank) as torchrun starts it: log, exit record,
signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainhouse.core import envspec
from trainhouse.executors.node import rank, torchrun
from trainhouse.executors.node.supervise import read_record
from trainhouse.jobfs import joblogs, layout


def test_its_names_are_the_layouts() -> None:
    assert rank.LOG_DIR_ENV == layout.LOG_DIR_ENV
    assert rank.ATTEMPT_DIR_ENV == layout.ATTEMPT_DIR_ENV
    assert rank.ATTEMPT_ENV == layout.ATTEMPT_ENV
    assert rank.RANK_EXIT_PREFIX == layout.RANK_EXIT_PREFIX
    assert rank.RANK_FINISHED_PREFIX == layout.RANK_FINISHED_PREFIX
    assert rank.PYTHON_ENV == envspec.PYTHON_ENV
    assert rank.log_name("3") == layout.log_name(3)
    assert rank.times_name("3") == layout.times_name(3)
    attempt = layout.AttemptLayout(Path("/x"))
    assert attempt.rank_exit(3).name == f"{rank.RANK_EXIT_PREFIX}3"
    assert attempt.rank_finished(3).name == f"{rank.RANK_FINISHED_PREFIX}3"


def start(tmp_path: Path, code: str) -> subprocess.Popen[bytes]:
    """The wrapper as torchrun starts it for rank 1 (no site: nothing of trainhouse importable)."""
    env = {
        **os.environ,
        "RANK": "1",
        layout.LOG_DIR_ENV: str(tmp_path / "logs"),
        layout.ATTEMPT_DIR_ENV: str(tmp_path),
        layout.ATTEMPT_ENV: "2",
    }
    return subprocess.Popen([*torchrun.RANK_WRAPPER, "python", "-c", code], env=env)


def test_it_logs_the_rank_and_records_its_exit(tmp_path: Path) -> None:
    proc = start(tmp_path, "import sys; print('hello'); print('oops', file=sys.stderr); exit(3)")
    assert proc.wait(30) == 3
    text = (tmp_path / "logs" / "rank-1.log").read_text()
    assert text.startswith("=== trainhouse: attempt 2, rank 1, ")
    assert "hello\n" in text and "oops\n" in text
    recorded = read_record(tmp_path / "exit-rank-1", within=tmp_path)
    assert recorded is not None and recorded[0] == 3
    assert recorded[1] is not None and abs(recorded[1] - time.time()) < 30


def test_it_forwards_sigterm_and_records_the_signal(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    proc = start(tmp_path, code)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    recorded = read_record(tmp_path / "exit-rank-1", within=tmp_path)
    assert recorded is not None and recorded[0] == -signal.SIGTERM


def test_a_command_that_cannot_start_is_127(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "0", layout.ATTEMPT_DIR_ENV: str(tmp_path)}
    env[layout.LOG_DIR_ENV] = str(tmp_path / "logs")
    proc = subprocess.run([*torchrun.RANK_WRAPPER, str(tmp_path / "missing")], env=env)
    assert proc.returncode == 127
    assert "cannot start" in (tmp_path / "logs" / "rank-0.log").read_text()
    recorded = read_record(tmp_path / "exit-rank-0", within=tmp_path)
    assert recorded is not None and recorded[0] == 127


def test_python_means_the_servers_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rank.PYTHON_ENV, raising=False)
    assert rank._argv(["python", "t.py"]) == [sys.executable, "t.py"]
    assert rank._argv(["/usr/bin/python3", "t.py"]) == [sys.executable, "t.py"]
    assert rank._argv(["bash", "t.sh"]) == ["bash", "t.sh"]


def test_python_means_the_jobs_environment_where_it_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(rank.PYTHON_ENV, "/envs/abc/bin/python")
    assert rank._argv(["python", "t.py"]) == ["/envs/abc/bin/python", "t.py"]
    assert rank._argv(["bash", "t.sh"]) == ["bash", "t.sh"]


def test_it_records_when_each_piece_was_written(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(0.3)\n"
        "print('second', flush=True)\n"
        "print('third', file=sys.stderr, flush=True)\n"
    )
    before = time.time()
    proc = start(tmp_path, code)
    assert proc.wait(30) == 0
    log = tmp_path / "logs" / "rank-1.log"
    lines, _ = joblogs.read_lines(log, log.with_name("rank-1.log.times"), within=tmp_path)
    texts = [ln.text.decode() for ln in lines]
    assert texts[0].startswith("=== trainhouse: attempt 2") and texts[1:] == [
        "first\n",
        "second\n",
        "third\n",
    ]
    times = [ln.time for ln in lines]
    assert all(t is not None and before <= t <= time.time() for t in times)
    assert times[2] - times[1] >= 0.25  # the second line was written after the sleep


def test_a_grandchild_holding_the_pipe_does_not_hold_the_rank(tmp_path: Path) -> None:
    ready = tmp_path / "grandchild"
    code = (
        "import pathlib, subprocess, sys\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)'])\n"
        f"pathlib.Path({str(ready)!r}).write_text(str(g.pid))\n"
        "print('parent done', flush=True)\n"
    )
    proc = start(tmp_path, code)
    try:
        assert proc.wait(15) == 0  # the user's process ended; its child keeps the pipe open
        assert "parent done\n" in (tmp_path / "logs" / "rank-1.log").read_text()
    finally:
        if ready.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(ready.read_text()), signal.SIGKILL)


def aborting(tmp_path: Path, *, finished: bool, message: str) -> str:
    """A rank's code that (after the SDK's record of a clean finish, if ``finished``) prints
    ``message`` and aborts, as torch's gloo threads do in the interpreter's teardown."""
    record = layout.AttemptLayout(tmp_path).rank_finished(1)
    return (
        "import os, pathlib, sys\n"
        + (f"pathlib.Path({str(record)!r}).write_text('1')\n" if finished else "")
        + f"print({message!r}, file=sys.stderr, flush=True)\n"
        + "os.abort()\n"
    )


TERMINATE = "terminate called without an active exception"


def test_an_abort_in_teardown_after_a_clean_finish_is_kept_at_zero(tmp_path: Path) -> None:
    proc = start(tmp_path, aborting(tmp_path, finished=True, message=TERMINATE))
    assert proc.wait(30) == 0
    recorded = read_record(tmp_path / "exit-rank-1", within=tmp_path)
    assert recorded is not None and recorded[0] == 0
    text = (tmp_path / "logs" / "rank-1.log").read_text()
    # said in the log, never silently
    assert TERMINATE in text and "aborted in the interpreter's teardown" in text
    assert "its exit is kept at 0" in text


@pytest.mark.parametrize(
    ("finished", "message"),
    [
        (False, TERMINATE),  # no clean finish recorded: the abort happened during the run
        (True, "Assertion `x' failed."),  # another abort after the finish is still one
    ],
)
def test_any_other_abort_stays_a_failure(tmp_path: Path, finished: bool, message: str) -> None:
    proc = start(tmp_path, aborting(tmp_path, finished=finished, message=message))
    assert proc.wait(30) == 128 + signal.SIGABRT
    recorded = read_record(tmp_path / "exit-rank-1", within=tmp_path)
    assert recorded is not None and recorded[0] == -signal.SIGABRT
    assert "kept at 0" not in (tmp_path / "logs" / "rank-1.log").read_text()


def test_a_linked_record_does_not_count(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("1")
    layout.AttemptLayout(tmp_path).rank_finished(1).symlink_to(tmp_path / "elsewhere")
    proc = start(tmp_path, aborting(tmp_path, finished=False, message=TERMINATE))
    assert proc.wait(30) == 128 + signal.SIGABRT
