"""The server's and the supervisors' hardening: non-dumpable processes, the database URL from a
private file, a supervisor that leaves nothing behind, state private to its user."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from tests.support.api import app_client
from tests.support.processes import unprivileged
from trainhouse.cli.app import app
from trainhouse.executors.node import cgroups, torchrun
from trainhouse.executors.node.supervise import read_record, supervised
from trainhouse.jobfs import hardening as _hardening
from trainhouse.usecases.settings import Settings


def run_python(code: str, *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- non-dumpable, and secrets from a file ---------------------------------------------------
def test_no_dump_makes_the_process_non_dumpable() -> None:
    result = run_python(
        """
        from trainhouse.jobfs import hardening as _hardening
        print(_hardening.is_dumpable(), _hardening.no_dump(), _hardening.is_dumpable())
        """
    )
    assert result.stdout.split() == ["True", "True", "False"], result.stderr


def secret_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / f"secret-{mode:o}"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_private_file_is_read_stripped(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "  postgresql://u:pw@h/db\n", 0o600)
    assert _hardening.read_private_file(str(path)) == "postgresql://u:pw@h/db"
    assert _hardening.read_private_file(str(secret_file(tmp_path, "x", 0o400))) == "x"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602], ids=lambda m: f"{m:04o}")
def test_a_file_others_may_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    path = secret_file(tmp_path, "postgresql://u:pw@h/db", mode)
    with pytest.raises(ValueError, match=rf"mode {mode:04o}.*chmod 600 {path}"):
        _hardening.read_private_file(str(path), "--db-file")


@pytest.mark.parametrize(
    ("text", "why"),
    [("", "is empty"), (" \n", "is empty"), ("a\nb\n", "more than one line")],
)
def test_an_empty_or_ambiguous_file_is_refused(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        _hardening.read_private_file(str(secret_file(tmp_path, text, 0o600)))


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read --db-file .*No such file"):
        _hardening.read_private_file(str(tmp_path / "nothing"), "--db-file")


def test_standard_input_is_read_once_and_then_closed_off() -> None:
    result = run_python(
        """
        import os
        from trainhouse.jobfs import hardening as _hardening
        print(_hardening.read_private_file("-"))
        print(os.readlink("/proc/self/fd/0"))
        """,
        stdin="sqlite:///from-stdin.db\n",
    )
    assert result.stdout.splitlines() == ["sqlite:///from-stdin.db", "/dev/null"], result.stderr


def test_settings_take_the_database_url_from_a_file(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "sqlite:///elsewhere.db\n", 0o600)
    settings = Settings(home=tmp_path, db_file=str(path))
    settings.validate()
    assert settings.database_url == "sqlite:///elsewhere.db"
    assert "elsewhere" not in repr(settings)  # read, and never shown
    path.unlink()
    assert settings.database_url == "sqlite:///elsewhere.db"  # read once
    with pytest.raises(ValueError, match=r"--db .* or --db-file .*not both"):
        Settings(home=tmp_path, db_url="sqlite:///a.db", db_file=str(path)).validate()
    lax = secret_file(tmp_path, "sqlite:///x.db", 0o644)
    with pytest.raises(ValueError, match="mode 0644"):
        Settings(home=tmp_path, db_file=str(lax)).validate()


def test_the_cli_takes_db_file_and_refuses_one_others_may_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'from-file.db'}"
    private = secret_file(tmp_path, url, 0o600)
    result = CliRunner().invoke(app, ["db", "current", "--db-file", str(private), "--json"])
    assert result.exit_code == 0, result.output
    assert "from-file.db" in result.stdout
    result = CliRunner().invoke(
        app, ["db", "current", "--json"], env={"TRAINHOUSE_DB_FILE": str(private)}
    )
    assert result.exit_code == 0 and "from-file.db" in result.stdout, result.output
    lax = secret_file(tmp_path, url, 0o644)
    for argv in (
        ["db", "upgrade", "--db-file", str(lax)],
        ["admin", "init", "--home", str(tmp_path), "--db-file", str(lax)],
        ["server", "--home", str(tmp_path), "--db-file", str(lax)],
    ):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert "mode 0644" in result.output and "chmod 600" in result.output, result.output
    result = CliRunner().invoke(
        app, ["db", "current", "--db", url, "--db-file", str(private)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2 and "not both" in result.output, result.output


# -- the supervisor --------------------------------------------------------------------------
# the launcher leaves a grandchild in a session of its own, with no marker, deaf to SIGTERM
ESCAPING_LAUNCHER = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(sys.argv[1] + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(3600)
    os._exit(0)
os.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
time.sleep(0.5)  # the test looks at the escapee meanwhile
sys.exit(3)
"""


def supervise(tmp_path: Path, *extra: str) -> tuple[int, int, float]:
    """Run the escaping launcher under the supervisor: its exit code and the escapee's PID and
    start time (read while it ran)."""
    pidfile = tmp_path / "escapee.pid"
    exit_file = tmp_path / "exit-launcher"
    cmd = [sys.executable, "-c", ESCAPING_LAUNCHER, str(pidfile)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainhouse.executors.node.supervise", *extra, str(exit_file), *cmd]
    )
    deadline = time.monotonic() + 30
    while not pidfile.exists():
        assert time.monotonic() < deadline, "the escapee never started"
        time.sleep(0.01)
    pid = int(pidfile.read_text())
    created = psutil.Process(pid).create_time()
    try:
        code = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(OSError):
            if alive(pid, created):
                os.kill(pid, signal.SIGKILL)  # leave nothing behind when the test fails
    recorded = read_record(exit_file, within=tmp_path)
    assert recorded is not None and recorded[0] == 3 and code == 3
    return code, pid, created


def alive(pid: int, created: float) -> bool:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    return False


def test_the_supervisor_kills_what_escaped_its_session_on_its_way_out(tmp_path: Path) -> None:
    _code, pid, created = supervise(tmp_path)
    assert not alive(pid, created), "the escaped grandchild outlived its supervisor"


CGROUP_ROOT, CGROUP_WHY = cgroups.attempt_root()


@pytest.mark.skipif(CGROUP_ROOT is None, reason=f"no cgroups here: {CGROUP_WHY}")
def test_the_supervisor_runs_the_launcher_in_a_cgroup_and_removes_it(tmp_path: Path) -> None:
    assert CGROUP_ROOT is not None
    cgroup = CGROUP_ROOT / f"{cgroups.PREFIX}unit-{uuid.uuid4().hex[:12]}"
    seen: list[str] = []

    def watch() -> None:  # the escapee's cgroup while it runs
        pidfile = tmp_path / "escapee.pid"
        while not pidfile.exists():
            time.sleep(0.005)
        seen.append(cgroups.own_cgroup(int(pidfile.read_text())) or "")

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        _code, pid, created = supervise(tmp_path, "--cgroup", str(cgroup))
    finally:
        watcher.join(timeout=30)
        cgroups.kill(cgroup)
        cgroups.remove(cgroup)
    assert seen and seen[0].endswith("/" + cgroup.name), seen
    assert not alive(pid, created)
    assert not cgroup.exists(), "the supervisor should remove the attempt's cgroup"


def test_a_cgroup_the_supervisor_cannot_make_is_done_without(tmp_path: Path) -> None:
    _code, pid, created = supervise(tmp_path, "--cgroup", str(tmp_path / "no" / "such"))
    assert not alive(pid, created)


def test_the_supervisors_command_line_names_its_exit_file_and_cgroup() -> None:
    exit_file = Path("/h/jobs/1/attempts/2/exit-launcher")
    plain = torchrun.command(exit_file, ["python", "t.py"], procs=1)
    assert supervised(plain) == (exit_file, None)
    grouped = torchrun.command(exit_file, ["t"], procs=1, cgroup=Path("/sys/fs/cgroup/th-1"))
    assert supervised(grouped) == (exit_file, Path("/sys/fs/cgroup/th-1"))
    assert supervised([sys.executable, "-m", "torch.distributed.run", "x"]) is None
    assert supervised([]) is None


def test_the_supervisor_is_not_dumpable(tmp_path: Path) -> None:
    """A process of the supervisor's user (its launcher here) cannot read its environment."""
    peek = "import os; print(os.getppid()); print(open(f'/proc/{os.getppid()}/environ').read())"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainhouse.executors.node.supervise",
            str(tmp_path / "exit-launcher"),
            *unprivileged([sys.executable, "-c", peek]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "PermissionError" in result.stderr, result.stdout


# -- private state ---------------------------------------------------------------------------
def test_the_umask_is_read_without_changing_it() -> None:
    before = os.umask(0o027)
    try:
        assert _hardening.umask() == 0o027
        with _hardening.private_umask():
            assert _hardening.umask() == 0o077
        assert _hardening.umask() == 0o027
    finally:
        os.umask(before)


def test_a_new_sqlite_database_is_private_whatever_the_umask(tmp_path: Path) -> None:
    from trainhouse.store import Store

    before = os.umask(0o022)
    try:
        Store(f"sqlite:///{tmp_path / 'trainhouse.db'}", migrate="auto").close()
    finally:
        os.umask(before)
    for name in ("trainhouse.db", "trainhouse.db-wal", "trainhouse.db-shm"):
        path = tmp_path / name
        if path.exists():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, name


def test_unpacked_code_gets_no_bit_the_umask_takes_away(tmp_path: Path) -> None:
    from trainhouse.jobfs.workdir import extract, pack

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "pkg" / "model.py").write_text("x = 1\n")
    archive = tmp_path / "w.tar.gz"
    archive.write_bytes(pack(src).data)
    with _hardening.private_umask():
        extract(archive, tmp_path / "out")
    modes = {
        str(p.relative_to(tmp_path / "out")): stat.S_IMODE(p.stat().st_mode)
        for p in (tmp_path / "out").rglob("*")
    }
    assert modes == {"run.sh": 0o700, "pkg": 0o700, "pkg/model.py": 0o600}


@pytest.mark.parametrize("uid", [0, 1000])
def test_a_server_run_as_root_says_so_at_start(
    tmp_path: Path, uid: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As root, every job is root too and non-dumpable processes keep nothing from it: the
    server says so (and runs all the same); as its own user it says nothing of the kind."""
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    with (
        caplog.at_level(logging.WARNING, logger="trainhouse.usecases.runtime"),
        app_client(tmp_path),
    ):
        pass
    said = [r.getMessage() for r in caplog.records if "runs as root" in r.getMessage()]
    if uid == 0:
        assert len(said) == 1 and "docs/production.md" in said[0], said
    else:
        assert said == []
