"""What a job cannot reach although it runs as the server's user: the database's secret in the
server's environment, memory or command line.

The servers here run as an ordinary user's process (:func:`tests.support.processes.unprivileged`:
no capabilities), so what the kernel refuses them and their jobs is what it refuses a production
server's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.jobs import LONG_SCRIPT, write_job
from tests.support.processes import effective_caps, marked_processes, unprivileged
from tests.support.servers import UnprivilegedServer, assert_clean_stop, db_upgrade, free_port

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


def unprivileged_server(
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: Path | None = None,
    port: int | None = None,
) -> UnprivilegedServer:
    """A started :class:`UnprivilegedServer` offering 2 CPU cores (checked to have no
    capability)."""
    server = UnprivilegedServer(
        home, port or free_port(), "--cpus", "2", *args, env=env, stdin=stdin
    )
    server.start(timeout=60)
    assert server.proc is not None
    assert effective_caps(server.proc.pid) == 0, "the server should have no capability"
    return server


def supervisor_of(job_id: int) -> psutil.Process:
    for proc in marked_processes():
        with contextlib.suppress(psutil.Error):
            if "trainhouse.executors.supervise" in proc.cmdline() and proc.environ().get(
                "TRAINHOUSE_JOB_ID"
            ) == str(job_id):
                return proc
    raise AssertionError(f"no supervisor for job {job_id}")


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


# -- re-adoption ------------------------------------------------------------------------------
def test_an_unprivileged_server_readopts_and_cancels_its_jobs(tmp_path: Path) -> None:
    """The supervisors are non-dumpable: a server that cannot read their environment still
    re-adopts them after a crash (by PID, start time and command line) and stops them."""
    home = tmp_path / "home"
    server = unprivileged_server(home, "--cancel-grace", "1")
    spec = write_job(tmp_path, LONG_SCRIPT, "name: adoptee\nentrypoint: python train.py\n")
    try:
        job = server.cli_json("submit", str(spec), "--detach")
        server.wait_step(job["id"], 3)
        supervisor = supervisor_of(job["id"])
        # what the server's user cannot read: it knows the supervisor by its command line
        assert read_as_server(f"/proc/{supervisor.pid}/environ") == "<PermissionError>"
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
    except BaseException:
        server.stop()  # it leaves no process behind when the test fails
        raise
    server = unprivileged_server(home, "--cancel-grace", "1", port=server.port)
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
    finally:
        assert_clean_stop(server)
