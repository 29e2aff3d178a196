"""The CLI as a user meets it: clear errors, exit codes, --json, detaching, following logs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import LONG_SCRIPT, write_job
from tests.support.servers import EXAMPLE, REPO, Server, free_port, run_cli

pytestmark = pytest.mark.integration


def assert_clean_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_unreachable_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["ps"], ["show", "1"], ["submit", str(EXAMPLE)], ["logs", "1"], ["cancel", "1"]):
        assert_clean_error(
            run_cli(*args, url=url), 3, f"cannot reach the trainhouse server at {url}"
        )


def test_bad_spec_is_refused_before_upload(tmp_path: Path) -> None:
    spec = write_job(tmp_path, "print(1)\n", "entrypoint: python train.py\nresources:\n  gpu: 1\n")
    assert_clean_error(
        run_cli("submit", str(spec), url="http://127.0.0.1:1"),
        2,
        "job.yaml:3: unknown key 'resources.gpu'",
    )
    assert_clean_error(run_cli("submit", str(tmp_path / "nope.yaml")), 2, "does not exist")
    assert_clean_error(run_cli("spec", str(spec)), 2, "unknown key")


def test_spec_command() -> None:
    schema = json.loads(run_cli("spec", "--schema").stdout)
    assert "entrypoint" in schema["properties"]
    resolved = run_cli("spec", str(EXAMPLE), "--set", "hparams.lr=0.5")
    assert resolved.returncode == 0
    assert json.loads(resolved.stdout)["hparams"]["lr"] == 0.5


def test_server_refuses_busy_port_and_bad_flags(server: Server, tmp_path: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    result = run_cli("server", "--port", port, "--home", str(tmp_path / "h2"))
    assert_clean_error(result, 2, f"127.0.0.1:{port}", "in use")
    assert_clean_error(
        run_cli("server", "--gpus", "x", "--home", str(tmp_path / "h3")), 2, "--gpus takes a count"
    )


def test_server_side_errors_and_exit_codes(server: Server, tmp_path: Path) -> None:
    too_big = write_job(
        tmp_path, "print(1)\n", "entrypoint: python train.py\nresources: {procs_per_node: 64}\n"
    )
    assert_clean_error(
        server.cli("submit", str(too_big)), 2, "can never run on this server", "4 CPU cores"
    )
    missing = write_job(tmp_path, "print(1)\n", "entrypoint: python other.py\n")
    assert_clean_error(server.cli("submit", str(missing)), 2, "'other.py' is not in the uploaded")
    assert_clean_error(server.cli("show", "999"), 2, "job 999 does not exist")
    script = (
        "import sys, traceback\n"
        "try:\n"
        "    raise ValueError('broken on purpose')\n"
        "except ValueError:\n"
        "    traceback.print_exc()\n"
        "    sys.exit(5)\n"
    )
    failing = write_job(tmp_path, script, "entrypoint: python train.py\n")
    result = server.cli("submit", str(failing))
    assert result.returncode == 5, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "rank 0 exited with code 5" in result.stdout
    submitted = re.search(r"submitted job (\d+)", result.stdout)
    assert submitted, result.stdout
    assert f"dashboard: {server.url}/#/jobs/{submitted[1]}\n" in result.stdout  # the job's page
    # the failure's last lines (its traceback) are printed once, in the final summary after
    # its "last lines:" (which ended the summary, empty)
    assert result.stdout.count("ValueError: broken on purpose") == 1, result.stdout
    summary = result.stdout[result.stdout.index("  reason: ") :]
    assert "; last lines:\n" in summary and "    ValueError: broken on purpose" in summary


def test_ctrl_c_detaches_without_killing(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, LONG_SCRIPT, "name: long\nentrypoint: python train.py\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainhouse", "submit", str(spec)],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TRAINHOUSE_URL": server.url},
    )
    deadline = time.monotonic() + 60
    with server.client as c:
        while not c.jobs() or c.jobs()[0]["state"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        job_id = c.jobs()[0]["id"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, out + err
        assert f"detached; job {job_id} keeps running" in out
        time.sleep(1)
        assert c.job(job_id)["state"] == "RUNNING"
        follow = subprocess.Popen(
            [sys.executable, "-m", "trainhouse", "logs", str(job_id), "-f", "--rank", "0"],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "TRAINHOUSE_URL": server.url},
        )
        server.wait_step(job_id, 2)  # progress before the cancel
        c.cancel(job_id)
        out, err = follow.communicate(timeout=60)  # -f ends by itself once the job has ended
        assert follow.returncode == 0, err
        assert "rank 0 step 1" in out
        assert server.wait(job_id, {"CANCELED"})["state"] == "CANCELED"


def test_ps_and_show(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, "print('done')\n", "name: quick\nentrypoint: python train.py\n")
    job = server.cli_json("submit", str(spec))
    assert job["state"] == "COMPLETED"
    assert server.cli_json("ps") == []
    assert [j["name"] for j in server.cli_json("ps", "--all")] == ["quick"]
    shown = server.cli("show", str(job["id"]))
    assert "COMPLETED" in shown.stdout and "rank exit codes" in shown.stdout.lower()
    assert server.cli_json("metrics", str(job["id"]))["series"] == []
    assert "no metrics yet" in server.cli("metrics", str(job["id"])).stdout
    assert "no checkpoints yet" in server.cli("checkpoints", str(job["id"])).stdout


def test_a_url_that_is_not_trainhouse() -> None:
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            result = run_cli("ps", url=url)
            if "cannot reach" not in result.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert_clean_error(result, 2, "is it a trainhouse server")
        assert "<html" not in result.stderr.lower()
    finally:
        web.terminate()
        web.wait()


def test_server_restarts_on_the_same_port_at_once(tmp_path: Path) -> None:
    """Regression: a port left with TIME-WAIT connections was reported as in use."""
    from tests.support.servers import Server, assert_clean_stop

    port = free_port()
    first = Server(tmp_path / "home", port, log=tmp_path / "first.log").start(timeout=60)
    with first.client as c:
        c.health()
        assert_clean_stop(first)  # the server closes the open connection: TIME-WAIT on its side
    second = Server(tmp_path / "home", port, log=tmp_path / "second.log").start(timeout=60)
    assert_clean_stop(second)
