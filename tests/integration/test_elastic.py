"""Elastic jobs on a real server with the local executor and declared CPUs: an elastic job
starts at its largest size, shrinks at a checkpoint for a job of higher priority and keeps
running beside it, grows back when that job has ended (not before its ``resize_interval``), and
sees every sample of every epoch exactly once across the resizes; below its least size it is
preempted whole instead. Driven through the CLI, as a user would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import ELASTIC, elastic_job, high_priority_job, shrink_and_grow_back
from tests.support.processes import bare_env
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = pytest.mark.integration


@pytest.fixture
def cpu_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", "--cpus", "4")
    yield srv
    assert_clean_stop(srv)


def ranks_of(attempt: dict[str, Any]) -> int:
    return sum(int(p["procs"]) for p in (attempt["placement"] or {"nodes": []})["nodes"])


def test_an_elastic_job_shrinks_for_priority_and_grows_back_seeing_every_sample(
    cpu_server: Server, tmp_path: Path
) -> None:
    srv = cpu_server
    run = shrink_and_grow_back(srv, tmp_path)
    job, first, plan, final, high_final = run.job, run.first, run.plan, run.job, run.high
    assert ranks_of(first) == 4, first["placement"]  # its largest size: the 4 CPUs are free
    assert not plan["would_start"] and plan["shrinks"] == [job["id"]] and plan["preempts"] == []
    high = high_final
    assert high_final["state"] == "COMPLETED", high_final
    assert final["state"] == "COMPLETED", final

    attempts = final["attempt_history"]
    assert [a["result"] for a in attempts] == ["resized", "resized", "completed"], attempts
    assert [ranks_of(a) for a in attempts] == [4, 2, 4]
    assert attempts[0]["reason"] == f"shrunk 4->2: job {high['id']} (high) needed 2 CPU cores"
    assert attempts[1]["reason"] == "grew 2->4: 2 CPU cores freed"
    assert attempts[0]["rank_exit_codes"] == {str(r): 0 for r in range(4)}  # it yielded
    assert final["restarts"] == 0 and final["infra_restarts"] == 0  # resizes are no restarts
    # the high job ran beside the shrunk job, and the job grew back only after it had ended,
    # no sooner than its resize_interval after its last resize
    assert attempts[1]["started_at"] < high_final["ended_at"]
    assert attempts[2]["started_at"] >= high_final["ended_at"] - 0.5
    assert attempts[2]["started_at"] - attempts[1]["started_at"] >= 3.0

    log = srv.cli("logs", str(job["id"]), "--rank", "0").stdout
    assert "attempt 2 world 2 resized True previous 4" in log, log[-3000:]
    assert "attempt 3 world 4 resized True previous 2" in log
    # run.stop_reason says why: a resize, and which
    assert "stops at step" in log and ": resize: shrunk 4->2: job" in log, log[-3000:]
    for epoch in range(4):
        assert f"epoch {epoch}: 240 samples, each once: True" in log, log[-3000:]
    steps = [p[0] for p in srv.cli_json("metrics", str(job["id"]))["series"][0]["points"]]
    assert steps == list(range(len(steps)))  # every step once, in order, across the resizes

    shown = srv.cli("show", str(job["id"])).stdout
    assert "RANKS" in shown and "grew 2->4" in shown and "shrunk 4->2" in shown


def test_an_elastic_job_is_never_shrunk_below_its_least_it_is_preempted(
    cpu_server: Server, tmp_path: Path
) -> None:
    srv = cpu_server
    with srv.client as c:  # over HTTP: the high-priority job comes long before the end
        job = c.submit(elastic_job(tmp_path, "3:4", epochs=2, sleep=0.2, name="wide"))
        srv.wait_step(job["id"], 3)
        high = c.submit(high_priority_job(tmp_path))
    assert srv.wait(high["id"], {"COMPLETED", "FAILED"})["state"] == "COMPLETED"
    final = srv.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=300)
    assert final["state"] == "COMPLETED", final
    attempts = final["attempt_history"]
    assert [a["result"] for a in attempts] == ["preempted", "completed"], attempts
    assert f"preempted by job {high['id']}" in attempts[0]["reason"]
    assert [ranks_of(a) for a in attempts] == [4, 4]  # never at 2, below its least of 3
    log = srv.cli("logs", str(job["id"]), "--rank", "0").stdout
    assert "epoch 0: 240 samples, each once: True" in log, log[-3000:]


def test_the_elastic_script_runs_unchanged_under_bare_torchrun(tmp_path: Path) -> None:
    """No server: the same script under ``torchrun`` at a fixed size (3 ranks, which divides
    none of the sizes above), every sample of each epoch once."""
    (tmp_path / "train.py").write_text(ELASTIC)

    def torchrun(ranks: int) -> str:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={ranks}",
                "train.py",
            ],
            cwd=tmp_path,
            env=bare_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    out = torchrun(3)
    assert "rank 0 attempt 1 world 3 resized False previous None" in out
    assert "epoch 0: 240 samples, each once: True" in out
    assert "epoch 1: 240 samples, each once: True" in out
