"""Jobs are never stuck: time limits are enforced, and a killed server requeues what it ran."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support.jobs import (
    HOLDING,
    LONG_SCRIPT,
    RESUMABLE,
    STUBBORN_SCRIPT,
    rank_process,
    write_job,
)
from tests.support.processes import marked_processes
from tests.support.servers import REPO, Server, assert_clean_stop, free_port, start_server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("script", "grace", "polite"),
    [(STUBBORN_SCRIPT, 2, False), (LONG_SCRIPT, 60, True)],
    ids=["ignores-should-stop", "obeys-should-stop"],
)
def test_max_runtime_stops_the_job(
    server: Server, tmp_path: Path, script: str, grace: int, polite: bool
) -> None:
    spec = write_job(
        tmp_path,
        script,
        f"""
        name: limited
        entrypoint: python train.py
        max_runtime: 3s
        preemption_grace: {grace}
    """,
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED", "CANCELED"}, timeout=120)
    assert final["state"] == "FAILED"
    assert "max_runtime exceeded" in final["reason"]
    assert not marked_processes()
    code = final["attempt_history"][0]["rank_exit_codes"].get("0")
    if polite:  # told through should_stop(), it exited by itself long before the 60 s grace
        assert code == 0
        assert "stopping at step" in server.cli("logs", str(job["id"])).stdout
    else:  # SIGTERM after the 2 s grace (None: it was still starting up)
        assert code is None or code < 0


def kill(srv: Server) -> None:
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()


def steps_of(srv: Server, job_id: int) -> list[int]:
    return [p[0] for p in srv.cli_json("metrics", str(job_id))["series"][0]["points"]]


def test_a_server_killed_twice_loses_nothing(tmp_path: Path) -> None:
    """The ranks keep training while the server is down; each new server re-adopts them."""
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(tmp_path, RESUMABLE, "name: survivor\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=80")
    srv.wait_step(job["id"], 8)
    for at_step in (30, 55):
        kill(srv)
        ranks = marked_processes()
        assert ranks, "the ranks should outlive a killed server"
        srv = start_server(home, "--cpus", "2", port=srv.port)
        srv.wait_step(job["id"], at_step)
        assert {p.pid for p in marked_processes()} >= {p.pid for p in ranks}
    try:
        final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)
        assert final["state"] == "COMPLETED", final
        assert [a["result"] for a in final["attempt_history"]] == ["completed"]
        assert (final["restarts"], final["infra_restarts"]) == (0, 0)
        assert sum("kept running" in (e["reason"] or "") for e in final["events"]) == 2
        assert steps_of(srv, job["id"]) == list(range(80))  # every step, exactly once
        assert [j["id"] for j in srv.cli_json("ps", "--all")] == [job["id"]]
    finally:
        assert_clean_stop(srv)


def test_a_job_that_ends_while_the_server_is_down_is_recorded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(tmp_path, RESUMABLE, "name: finisher\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach", "--set", "hparams.steps=30")
    srv.wait_step(job["id"], 5)
    kill(srv)
    deadline = time.monotonic() + 120
    while marked_processes():  # it finishes with no server to talk to
        assert time.monotonic() < deadline
        time.sleep(0.5)
    srv = start_server(home, "--cpus", "2", port=srv.port)
    try:
        final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=60)
        assert final["state"] == "COMPLETED", final
        assert [a["result"] for a in final["attempt_history"]] == ["completed"]
        # the points it could not send were spooled, and are stored now
        assert steps_of(srv, job["id"]) == list(range(30))
    finally:
        assert_clean_stop(srv)


def test_ranks_killed_while_the_server_is_down_restart_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(tmp_path, RESUMABLE, "name: victim\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach")
    srv.wait_step(job["id"], 12)
    kill(srv)
    for proc in marked_processes():
        proc.kill()
    srv = start_server(home, "--cpus", "2", port=srv.port)
    try:
        final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)
        assert final["state"] == "COMPLETED", final
        first = final["attempt_history"][0]
        assert first["result"] in ("lost", "failed") and first["failure"] == "infra"
        assert (final["restarts"], final["infra_restarts"]) == (0, 1)
        log = srv.cli("logs", str(job["id"])).stdout
        start_line = [ln for ln in log.splitlines() if "attempt 2 starts at step" in ln]
        assert start_line and not start_line[0].endswith("step 0")
        assert steps_of(srv, job["id"]) == list(range(40))
    finally:
        assert_clean_stop(srv)


def test_a_rank_killed_after_a_save_the_server_never_heard_of_loses_no_step(
    tmp_path: Path,
) -> None:
    """The race chaos found (issue 13): the server is down, rank 0 buffers its steps and saves
    a checkpoint the server cannot hear of, and is killed before its next flush. The record a
    resume finds the checkpoint by appears only once the steps before it are spooled, so the
    next attempt resumes after it and every step is stored, each once."""
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(tmp_path, HOLDING, "name: held\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach")
    srv.wait_step(job["id"], 2)
    kill(srv)  # from here on rank 0 can only buffer (and spool) its steps
    job_dir = home / "jobs" / str(job["id"])
    log = job_dir / "logs" / "rank-0.log"
    deadline = time.monotonic() + 120
    while "holding after the checkpoint of step 10" not in (
        log.read_text() if log.exists() else ""
    ):
        assert time.monotonic() < deadline, "the job never reached its hold"
        time.sleep(0.2)
    assert (job_dir / "checkpoints" / "step-000000010.pt.json").is_file()  # a resume finds it
    rank = rank_process(job["id"], 0)
    assert rank is not None
    rank.kill()  # before any flush could reach a server
    srv = start_server(home, "--cpus", "2", port=srv.port)
    try:
        final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)
        assert final["state"] == "COMPLETED", final
        assert final["attempts"] == 2 and final["infra_restarts"] == 1
        out = srv.cli("logs", str(job["id"])).stdout
        assert "attempt 2 starts at step 11" in out  # from the checkpoint of step 10
        assert steps_of(srv, job["id"]) == list(range(30))  # steps 3-10 came from the spool
    finally:
        assert_clean_stop(srv)


def test_demo_runs_end_to_end_and_keeps_its_server(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    # a home as long as makes the old line naming it wrap inside "press Ctrl-C to stop it" at
    # 200 columns (CI's home did: the test waited for the words unseen); a line stays whole now
    base = Path(tempfile.mkdtemp(prefix="th-demo-", dir="/tmp"))
    said = f"the demo server keeps running at {url} (the dashboard; state in "
    home = base / ("x" * (200 - len(said) - len("): press Ctrl-C") - len(f"{base}//demo"))) / "demo"
    assert len(f"{said}{home}): press Ctrl-C") == 200
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainhouse",
            "demo",
            "--home",
            str(home),
            "--url",
            url,
            "--set",
            "hparams.epochs=2",
            "--keep",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    out = ""
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # until the demo says its server stays
            out += line
            if "press Ctrl-C to stop it" in line:
                break
        assert "press Ctrl-C to stop it" in out, out
        started = re.search(r"starting a trainhouse server at (http://127\.0\.0\.1:\d+)", out)
        assert started, out
        url = started[1]  # nothing answered at --url: the demo started its own server
        assert "COMPLETED" in out and "validation accuracy" in out
        assert f"dashboard: {url}/#/jobs/1" in out  # printed on submit
        assert f"the job's page on the dashboard: {url}/#/jobs/1" in out
        # the server is still there after the job ended: the dashboard and the job answer
        with httpx.Client(base_url=url, timeout=30) as http:
            assert "trainhouse" in http.get("/").text
            assert http.get("/api/v1/jobs/1").json()["state"] == "COMPLETED"
        time.sleep(1)
        assert demo.poll() is None  # still waiting for Ctrl-C
        demo.send_signal(signal.SIGINT)  # a terminal's Ctrl-C (the server has its own session)
        rest, _ = demo.communicate(timeout=120)
        out += rest
    finally:
        if demo.poll() is None:  # a Ctrl-C first: the demo stops its server (a session apart)
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
    assert demo.returncode == 0, out  # the job's result, not the Ctrl-C
    assert "trainhouse checkpoints 1" in out and "the demo server has stopped" in out
    assert "exited by itself" not in out
    assert (home / "jobs" / "1" / "checkpoints").is_dir()
    shutil.rmtree(base)
    with pytest.raises(httpx.TransportError):  # and the Ctrl-C stopped it
        httpx.get(url + "/api/v1/health", timeout=5)


def test_stopped_server_requeues_its_jobs_and_leaves_no_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(tmp_path, RESUMABLE, "name: paused\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach")
    srv.wait_step(job["id"], 7)
    assert_clean_stop(srv)  # SIGTERM: the server stops the job's processes before it exits
    assert not marked_processes()

    srv2 = start_server(home, "--cpus", "2")
    try:
        final = srv2.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)
        assert final["state"] == "COMPLETED", final
        assert [a["result"] for a in final["attempt_history"]] == ["interrupted", "completed"]
        assert "the server stopped while it ran" in final["attempt_history"][0]["reason"]
        log = srv2.cli("logs", str(job["id"])).stdout
        resumed = re.search(r"attempt 2 starts at step (\d+)", log)
        assert resumed is not None, log
        start = int(resumed.group(1))
        assert start > 0 and (start - 1) % 5 == 0  # right after a checkpoint (every 5 steps)
    finally:
        assert_clean_stop(srv2)


def test_cancel_kills_a_job_that_ignores_should_stop(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", "--cpus", "2", "--cancel-grace", "1")
    try:
        spec = write_job(tmp_path, STUBBORN_SCRIPT, "name: stubborn\nentrypoint: python train.py\n")
        job = srv.cli_json("submit", str(spec), "--detach")
        srv.wait_step(job["id"], 2)
        result = srv.cli("cancel", str(job["id"]))
        assert result.returncode == 0 and "CANCELED" in result.stdout, result.stdout
        attempt = srv.cli_json("show", str(job["id"]))["attempt_history"][0]
        assert attempt["rank_exit_codes"]["0"] < 0  # ended by a signal
        assert not marked_processes()
    finally:
        assert_clean_stop(srv)


COUNTER_SCRIPT = """
import time
import trainhouse

with trainhouse.init() as run:
    for i in range(120):
        print(f"rank {run.rank} line {i}", flush=True)
        time.sleep(0.05)
"""


def test_logs_follow_resumes_across_a_server_restart(tmp_path: Path) -> None:
    """`trainhouse logs -f` streams every rank; the server dies and comes back; every line
    arrives once, in order, and -f ends by itself when the job does."""
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(
        tmp_path,
        COUNTER_SCRIPT,
        "name: chatty\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
    )
    job = srv.cli_json("submit", str(spec), "--detach")
    follow = subprocess.Popen(
        [sys.executable, "-m", "trainhouse", "logs", str(job["id"]), "-f"],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TRAINHOUSE_URL": srv.url},
    )
    try:
        deadline = time.monotonic() + 120
        log = home / "jobs" / str(job["id"]) / "logs" / "rank-1.log"
        while "line 30" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        kill(srv)
        time.sleep(1)
        srv = start_server(home, "--cpus", "2", port=srv.port)
        out, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    try:
        assert follow.returncode == 0, err
        assert "reconnecting" in err
        for rank in (0, 1):
            lines = [ln for ln in out.splitlines() if ln.startswith(f"[rank {rank}] rank")]
            assert lines == [f"[rank {rank}] rank {rank} line {i}" for i in range(120)]
    finally:
        assert_clean_stop(srv)
