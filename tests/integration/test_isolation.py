"""What a job cannot reach although it runs as the server's user: the database's secret in the
server's environment, memory or command line; processes that escape its end; the server's state
through other users' eyes.

The servers here run as an ordinary user's process (:func:`tests.support.processes.unprivileged`:
no capabilities), so what the kernel refuses them and their jobs is what it refuses a production
server's, and in a cgroup of the test's own: one its user owns (systemd's ``Delegate=yes``), or
one it may not write to, where it must do without a cgroup per attempt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.jobs import LONG_SCRIPT, RESUMABLE, write_job
from tests.support.processes import effective_caps, marked_processes, unprivileged
from tests.support.servers import (
    UnprivilegedServer,
    assert_clean_stop,
    db_upgrade,
    free_port,
    start_server,
)
from trainhouse.executors.node import cgroups

pytestmark = pytest.mark.integration

SECRET = "Sekr1t-d0-n0t-l3ak"  # the password of the test's database URL (trust auth ignores it)
NOBODY = 65534

# walks from its own process up to init, trying each process's environment, command line and
# memory, and the database URL's file; writes what it could read to $REPORT
SNOOP = """
import json, os

def attempt(path, size=1 << 20):
    try:
        with open(path, "rb") as fh:
            return fh.read(size).decode(errors="replace")
    except OSError as exc:
        return f"<{type(exc).__name__}>"

seen = {}
pid = os.getpid()
while pid > 1:
    stat = attempt(f"/proc/{pid}/stat")
    seen[pid] = {
        "environ": attempt(f"/proc/{pid}/environ"),
        "cmdline": attempt(f"/proc/{pid}/cmdline"),
        "mem": attempt(f"/proc/{pid}/mem", 1),
    }
    pid = int(stat.rpartition(")")[2].split()[1])
seen["db_file"] = attempt(os.environ["DB_FILE"]) if os.environ.get("DB_FILE") else ""
with open(os.environ["REPORT"], "w") as fh:
    json.dump(seen, fh)
"""

# rank 0 leaves a process behind that no scan for the marker finds: a grandchild in a session
# of its own, re-executed with the marker scrubbed from its environment, deaf to SIGTERM; it
# writes its PID to $ESCAPE_PIDFILE. The script itself never stops by itself.
ESCAPING_SCRIPT = """
import os, sys, time

ESCAPEE = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
'''

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        env = {k: v for k, v in os.environ.items() if k != "TRAINHOUSE_RUN_MARKER"}
        argv = [sys.executable, "-c", ESCAPEE, os.environ["ESCAPE_PIDFILE"]]
        os.execve(sys.executable, argv, env)
    os._exit(0)
os.wait()

import trainhouse

with trainhouse.init() as run:
    step = 0
    while True:
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.05)
"""

ROOT = os.geteuid() == 0
CGROUPS_HERE, CGROUPS_WHY = cgroups.attempt_root()  # where the test may make cgroups


@pytest.fixture(params=[True, False], ids=["cgroup", "no-cgroup"])
def server_cgroup(request: pytest.FixtureRequest) -> Iterator[tuple[Path, bool]]:
    """A cgroup for a test's servers, and whether they may make cgroups in it: owned by the
    servers' user (cgroups per attempt), or by another user (none)."""
    if not ROOT or CGROUPS_HERE is None:
        pytest.skip(f"the test cannot make cgroups here: {CGROUPS_WHY}")
    path = CGROUPS_HERE / f"trainhouse-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    writable: bool = request.param
    if not writable:
        for entry in [path, *path.iterdir()]:
            os.chown(entry, NOBODY, NOBODY)
    try:
        yield path, writable
    finally:
        cgroups.kill(path)
        assert cgroups.remove(path), f"cannot remove the test's cgroup {path}"


def unprivileged_server(
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: Path | None = None,
    cgroup: Path | None = None,
    port: int | None = None,
) -> UnprivilegedServer:
    """A started :class:`UnprivilegedServer` offering 2 CPU cores (checked to have no
    capability)."""
    server = UnprivilegedServer(
        home, port or free_port(), "--cpus", "2", *args, env=env, stdin=stdin, cgroup=cgroup
    )
    server.start(timeout=60)
    assert server.proc is not None
    assert effective_caps(server.proc.pid) == 0, "the server should have no capability"
    return server


def supervisor_of(job_id: int) -> psutil.Process:
    for proc in marked_processes():
        with contextlib.suppress(psutil.Error):
            if "trainhouse.executors.node.supervise" in proc.cmdline() and proc.environ().get(
                "TRAINHOUSE_JOB_ID"
            ) == str(job_id):
                return proc
    raise AssertionError(f"no supervisor for job {job_id}")


def attempt_cgroup(home: Path, job_id: int, attempt: int = 1) -> str:
    """The name of an attempt's cgroup (LocalExecutor.cgroup)."""
    home_id = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return f"{cgroups.PREFIX}{home_id}-{job_id}-{attempt}"


def read_as_server(path: str) -> str:
    """Read ``path`` as the servers here run: its text, or the error's name."""
    code = (
        "import sys\ntry:\n    print(open(sys.argv[1], 'rb').read().decode(errors='replace'))\n"
        "except OSError as exc:\n    print(f'<{type(exc).__name__}>')"
    )
    result = subprocess.run(
        unprivileged([sys.executable, "-c", code, path]), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def alive(pid: int, created: float) -> bool:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    return False


# -- the database's secret -------------------------------------------------------------------
@pytest.fixture
def secret_db(pg_url: str) -> str:
    """The test's PostgreSQL database, upgraded, its URL with a password trust auth ignores."""
    assert "://postgres@" in pg_url
    url = pg_url.replace("://postgres@", f"://postgres:{SECRET}@", 1)
    db_upgrade(url)
    return url


@pytest.mark.parametrize("given_as", ["environment", "db-file-on-stdin"])
def test_a_job_finds_no_database_secret_in_its_parents(
    tmp_path: Path, secret_db: str, given_as: str
) -> None:
    """A job walks up its parents (rank wrapper, torchrun, supervisor, server) reading each
    one's environment, command line and memory, and the URL's file: the password is nowhere."""
    report = tmp_path / "report.json"
    env = {"REPORT": str(report)}
    if given_as == "environment":
        server = unprivileged_server(tmp_path / "home", env={"TRAINHOUSE_DB": secret_db})
    else:
        # as systemd's StandardInput=file: hands the server a file only root may read
        db_file = tmp_path / "db-url"
        db_file.write_text(secret_db + "\n")
        db_file.chmod(0o600)
        os.chown(db_file, NOBODY, NOBODY)
        env["DB_FILE"] = str(db_file)
        server = unprivileged_server(tmp_path / "home", "--db-file", "-", stdin=db_file)
    try:
        spec = write_job(
            tmp_path,
            SNOOP,
            f"name: snoop\nentrypoint: python train.py\nenv: {json.dumps(env)}\n",
        )
        job = server.cli_json("submit", str(spec), "--detach")
        final = server.wait(job["id"], {"COMPLETED", "FAILED"})
        assert final["state"] == "COMPLETED", server.cli("logs", str(job["id"])).stdout
        seen = json.loads(report.read_text())
        assert server.proc is not None
        assert str(server.proc.pid) in seen, "the walk should pass the server"
        assert seen[str(server.proc.pid)]["environ"] == "<PermissionError>"
        assert seen[str(server.proc.pid)]["mem"] == "<PermissionError>"
        if given_as != "environment":
            assert seen["db_file"] == "<PermissionError>"
        leaks = [pid for pid, what in seen.items() if SECRET in json.dumps(what)]
        assert not leaks, f"the database password is readable in {leaks}: {seen}"
        # the server itself works on that database
        assert server.client.health()["status"] == "ok"
    finally:
        assert_clean_stop(server)


# -- processes that escape -------------------------------------------------------------------
def test_a_process_that_escapes_its_session_and_marker_dies_with_its_job(
    tmp_path: Path, server_cgroup: tuple[Path, bool]
) -> None:
    """A rank leaves a daemon that is in no scan for the marker and in no process group of the
    attempt: it is counted as the job's while it runs, and gone once the job is canceled."""
    cgroup, per_attempt = server_cgroup
    pidfile = tmp_path / "escapee.pid"
    home = tmp_path / "home"
    server = unprivileged_server(
        home, "--cancel-grace", "1", "--monitor-interval", "0.3", cgroup=cgroup
    )
    escapee: tuple[int, float] | None = None
    try:
        spec = write_job(
            tmp_path,
            ESCAPING_SCRIPT,
            f"""
            name: escaping
            entrypoint: python train.py
            env: {{ESCAPE_PIDFILE: "{pidfile}"}}
            """,
        )
        job = server.cli_json("submit", str(spec), "--detach")
        server.wait_step(job["id"], 3)
        pid = int(pidfile.read_text())
        proc = psutil.Process(pid)
        escapee = (pid, proc.create_time())
        supervisor = supervisor_of(job["id"])
        assert "TRAINHOUSE_RUN_MARKER" not in proc.environ()
        assert os.getsid(pid) != os.getsid(supervisor.pid)
        in_cgroup = (cgroups.own_cgroup(pid) or "").rpartition("/")[2]
        assert (in_cgroup == attempt_cgroup(home, job["id"])) == per_attempt, in_cgroup

        # counted as the job's: one process more than those carrying the marker
        marked = len(marked_processes())
        deadline = time.monotonic() + 30
        while True:
            counted = [j.get("processes") or 0 for j in server.cli_json("top")["jobs"]]
            if counted and counted[0] >= marked + 1:
                break
            assert time.monotonic() < deadline, (
                f"the escaped process is not counted as the job's: {counted}, {marked} marked"
            )
            time.sleep(0.3)

        result = server.cli("cancel", str(job["id"]))
        assert result.returncode == 0 and "CANCELED" in result.stdout, result.stdout
        deadline = time.monotonic() + 10
        while alive(*escapee):
            assert time.monotonic() < deadline, f"the escaped process {pid} outlived its job"
            time.sleep(0.1)
        assert not marked_processes()
        assert not (cgroup / attempt_cgroup(home, job["id"])).exists()
    finally:
        if escapee is not None and alive(*escapee):  # leave nothing behind when it fails
            os.kill(escapee[0], signal.SIGKILL)
        assert_clean_stop(server)


def test_an_unprivileged_server_readopts_and_cancels_its_jobs(
    tmp_path: Path, server_cgroup: tuple[Path, bool]
) -> None:
    """The supervisors are non-dumpable: a server that cannot read their environment still
    re-adopts them after a crash (by PID, start time and command line) and stops them."""
    cgroup, per_attempt = server_cgroup
    home = tmp_path / "home"
    server = unprivileged_server(home, "--cancel-grace", "1", cgroup=cgroup)
    spec = write_job(tmp_path, LONG_SCRIPT, "name: adoptee\nentrypoint: python train.py\n")
    try:
        job = server.cli_json("submit", str(spec), "--detach")
        server.wait_step(job["id"], 3)
        supervisor = supervisor_of(job["id"])
        # what the server's user cannot read: it knows the supervisor by its command line
        assert read_as_server(f"/proc/{supervisor.pid}/environ") == "<PermissionError>"
        assert ("--cgroup" in supervisor.cmdline()) == per_attempt
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
    except BaseException:
        server.stop()  # it leaves no process behind when the test fails
        raise
    server = unprivileged_server(home, "--cancel-grace", "1", cgroup=cgroup, port=server.port)
    try:
        at = server.cli_json("show", str(job["id"]))["last_step"] or 0
        server.wait_step(job["id"], at + 5)  # the same attempt trains on
        shown = server.cli_json("show", str(job["id"]))
        assert shown["attempts"] == 1 and shown["state"] == "RUNNING", shown
        assert any("kept running" in (e["reason"] or "") for e in shown["events"]), shown
        result = server.cli("cancel", str(job["id"]))
        assert result.returncode == 0 and "CANCELED" in result.stdout, result.stdout
        assert not alive(supervisor.pid, supervisor.create_time())
        assert not marked_processes()
        assert not (cgroup / attempt_cgroup(home, job["id"])).exists()
    finally:
        assert_clean_stop(server)


# -- the server's state ----------------------------------------------------------------------
def _tree(root: Path) -> Iterator[Path]:
    yield root
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            yield Path(dirpath) / name


def test_a_fresh_home_is_private_to_the_servers_user(tmp_path: Path) -> None:
    """After a job ran (code unpacked, logs, checkpoints, exit records, the SQLite database),
    nothing in HOME is open to the server user's group or to other users."""
    home = tmp_path / "home"
    server = start_server(home, "--cpus", "2")
    try:
        spec = write_job(tmp_path, RESUMABLE, "name: private\nentrypoint: python train.py\n")
        job = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=6")
        final = server.wait(job["id"], {"COMPLETED", "FAILED"})
        assert final["state"] == "COMPLETED", final
    finally:
        assert_clean_stop(server)
    modes = {
        str(path.relative_to(tmp_path)): stat.S_IMODE(path.lstat().st_mode) for path in _tree(home)
    }
    for expected in ("home/trainhouse.db", "home/blobs", "home/jobs/1/logs/rank-0.log"):
        assert expected in modes, sorted(modes)
    assert any("/checkpoints/" in p for p in modes), sorted(modes)
    assert any("/workdir/train.py" in p for p in modes), sorted(modes)
    shared = {path: f"{mode:04o}" for path, mode in modes.items() if mode & 0o077}
    assert not shared, f"readable or writable by group or others: {shared}"
