"""The scheduler on a real server with declared GPUs: preemption that checkpoints first, the
queue view, dry runs, priorities and quotas, driven through the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jobs import RESUMABLE, write_job
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = pytest.mark.integration

QUICK = "import time\nprint('high priority work', flush=True)\ntime.sleep(1)\n"


@pytest.fixture
def gpu_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", "--cpus", "4", "--gpus", "2")
    yield srv
    assert_clean_stop(srv)


def test_high_priority_job_preempts_and_the_victim_resumes(
    gpu_server: Server, tmp_path: Path
) -> None:
    srv = gpu_server
    low_spec = write_job(
        tmp_path / "low",
        RESUMABLE,
        """
        name: low-job
        entrypoint: python train.py
        priority: low
        resources: {gpus_per_node: 2}
        preemption_grace: 60
        hparams: {steps: 60}
    """,
    )
    high_spec = write_job(
        tmp_path / "high",
        QUICK,
        """
        name: high-job
        entrypoint: python train.py
        priority: high
        resources: {gpus_per_node: 2}
    """,
    )
    low = srv.cli_json("submit", str(low_spec), "--detach")
    srv.wait_step(low["id"], 12)
    plan = srv.cli_json("submit", str(high_spec), "--dry-run")
    assert not plan["would_start"] and plan["preempts"] == [low["id"]]
    high = srv.cli_json("submit", str(high_spec), "--detach")

    high_final = srv.wait(high["id"], {"COMPLETED", "FAILED"})
    low_final = srv.wait(low["id"], {"COMPLETED", "FAILED"})
    assert high_final["state"] == "COMPLETED", high_final
    assert low_final["state"] == "COMPLETED", low_final

    attempts = low_final["attempt_history"]
    assert [a["result"] for a in attempts] == ["preempted", "completed"]
    assert attempts[0]["rank_exit_codes"] == {"0": 0, "1": 0}  # it yielded, nothing was killed
    assert f"preempted by job {high['id']}" in attempts[0]["reason"]
    assert low_final["restarts"] == 0
    states = [e["to_state"] for e in low_final["events"]]
    assert "PREEMPTED" in states
    # the high job ran on the GPUs the low job gave back, after it had yielded
    assert high_final["started_at"] >= attempts[0]["ended_at"] - 0.5
    assert high_final["placement"]["nodes"][0]["gpus"] == [0, 1]

    shown = srv.cli("logs", str(low["id"]), "--rank", "0")
    log = shown.stdout
    assert "rank 0 yields at step " in log, (shown.returncode, shown.stderr, log[-3000:])
    yielded = int(log.split("rank 0 yields at step ")[1].split()[0])
    assert f"rank 0 attempt 2 starts at step {yielded + 1}" in log  # resumed from its checkpoint
    rank1 = srv.cli("logs", str(low["id"]), "--rank", "1").stdout
    assert f"rank 1 yields at step {yielded}" in rank1  # the same step on every rank
    points = srv.cli_json("metrics", str(low["id"]))["series"][0]["points"]
    assert [p[0] for p in points] == list(range(60))  # every step exactly once


def test_queue_priority_and_quota_commands(gpu_server: Server, tmp_path: Path) -> None:
    srv = gpu_server
    long = write_job(
        tmp_path / "long",
        RESUMABLE,
        """
        name: hog
        entrypoint: python train.py
        resources: {gpus_per_node: 2}
    """,
    )
    endless = ["--detach", "--set", "hparams.steps=100000"]  # none ends before it is canceled
    first = srv.cli_json("submit", str(long), *endless)
    srv.wait(first["id"], {"RUNNING"})
    second = srv.cli_json("submit", str(long), *endless, "--set", "name=second")
    third = srv.cli_json("submit", str(long), *endless, "--set", "name=third")

    queue = srv.cli_json("queue")
    assert [j["id"] for j in queue["jobs"]] == [second["id"], third["id"]]
    assert "needs 2 GPU(s)" in queue["jobs"][0]["reason"]
    assert f"job {second['id']} is reserved to start first" in queue["jobs"][1]["reason"]
    shown = srv.cli_json("show", str(third["id"]))
    assert shown["reason"].startswith("queue position 2")

    # a running job's priority is refused (asked before anything of a higher tier can preempt it)
    bad = srv.cli("set-priority", str(first["id"]), "low")
    assert bad.returncode == 2 and "only a queued job's priority can change" in bad.stderr
    assert srv.cli("set-priority", str(third["id"]), "top").returncode == 2
    # raised to high, the third job preempts the running normal one and starts ahead of the second
    assert srv.cli("set-priority", str(third["id"]), "high").returncode == 0
    assert srv.cli_json("show", str(third["id"]))["priority"] == "high"
    srv.wait(third["id"], {"RUNNING"})
    assert srv.wait(first["id"], {"QUEUED"})["state"] == "QUEUED"
    queue = srv.cli_json("queue")
    assert sorted(j["id"] for j in queue["jobs"]) == [first["id"], second["id"]]

    owner = srv.cli_json("show", str(first["id"]))["owner"]
    assert srv.cli("admin", "quota", "set", owner, "--gpus", "1").returncode == 0
    quotas = srv.cli_json("admin", "quota", "list")
    assert [u["max_gpus"] for u in quotas["users"] if u["owner"] == owner] == [1]
    queue = srv.cli_json("queue")
    assert all(j["reason"].split(": ", 1)[1].startswith("quota:") for j in queue["jobs"])
    assert srv.cli("admin", "quota", "clear", owner).returncode == 0
    for job in (first, second, third):
        srv.cli("cancel", str(job["id"]))
