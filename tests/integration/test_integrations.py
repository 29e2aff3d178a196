"""The Hugging Face Trainer and PyTorch Lightning as real trainhouse jobs: the examples under
``examples/transformers`` and ``examples/lightning``, submitted to a real server.

Each test runs its example through the three things the integration carries: its rank is
SIGKILLed once the first checkpoint is registered, the restart resumes from that checkpoint
(the resumed global step is the checkpoint's, every metric step is stored once), and a cancel
(the same stop request as a preemption) makes the framework save and stop cleanly.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import rank_process
from tests.support.servers import REPO, Server, assert_clean_stop, start_server
from trainhouse.jobfs.storage import open_storage

pytestmark = pytest.mark.integration

TRANSFORMERS = REPO / "examples" / "transformers" / "trainhouse.yaml"
LIGHTNING = REPO / "examples" / "lightning" / "trainhouse.yaml"


@pytest.fixture
def slow_stop_server(tmp_path: Path) -> Iterator[Server]:
    """A real server whose cancel waits 60 s for a job's own stop before SIGTERM (the default
    10 s: a framework saving on a loaded 2-core machine may take longer, and the test asserts
    the job stopped by itself)."""
    srv = start_server(tmp_path / "home", "--cpus", "4", "--cancel-grace", "60")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def _wait_checkpoint(server: Server, job_id: int, timeout: float = 240) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    with server.client as c:
        while time.monotonic() < deadline:
            found = c.checkpoints(job_id)["checkpoints"]
            if found:
                return list(found)
            time.sleep(0.2)
    raise AssertionError(f"job {job_id} registered no checkpoint in {timeout}s")


def _wait_resumed(server: Server, job_id: int, step: int) -> None:
    """Wait until the second attempt has resumed and reported ``step``."""
    deadline = time.monotonic() + 240
    with server.client as c:
        while time.monotonic() < deadline:
            job = c.job(job_id)
            assert job["state"] not in ("COMPLETED", "FAILED", "CANCELED"), job
            if job["attempts"] >= 2 and (job.get("last_step") or 0) >= step:
                text, _, _ = c.logs(job_id, rank=0)
                if "trainhouse: resuming" in text:
                    return
            time.sleep(0.2)
    raise AssertionError(f"job {job_id} never resumed and reached step {step}")


def _kill_resume_and_stop(server: Server, spec: Path, name: str) -> dict[str, Any]:
    """Submit ``spec`` (endless, a checkpoint every 5 steps), SIGKILL its rank after the first
    checkpoint, let the restart resume and run on, cancel it; what the test checks."""
    job = server.cli_json(
        "submit",
        str(spec),
        "--detach",
        "--set",
        "hparams.max_steps=100000",
        "--set",
        "hparams.save_steps=5",
    )
    job_id = int(job["id"])
    first = _wait_checkpoint(server, job_id)
    proc = rank_process(job_id, 0)
    assert proc is not None
    proc.kill()
    registered = max(c["step"] for c in server.client.checkpoints(job_id)["checkpoints"])
    # (retention may already have removed the step-5 one on a busy machine: keep_last)
    assert registered >= first[0]["step"] >= 5 and first[0]["step"] % 5 == 0, first

    # the restart resumes from the newest checkpoint and trains on past it, then is asked to stop
    _wait_resumed(server, job_id, registered + 3)
    assert server.cli("cancel", str(job_id)).returncode == 0
    final = server.wait(job_id, {"CANCELED", "FAILED", "COMPLETED"})
    log = server.cli("logs", str(job_id), "--rank", "0").stdout
    assert final["state"] == "CANCELED", (final, log[-3000:])
    history = final["attempt_history"]
    assert [h["result"] for h in history] == ["failed", "canceled"], history
    assert history[1]["rank_exit_codes"] == {"0": 0}, (history, log[-3000:])  # a clean stop
    found = re.search(rf"resuming {name} from \S*step-(\d+)", log)
    assert found is not None, log[-3000:]
    # (one written as the rank was killed may be registered at the attempt's end, from its record)
    resumed_from = int(found.group(1))
    assert resumed_from >= registered, (resumed_from, registered)
    assert "the server asks this job to stop" in log, log[-3000:]
    return {"id": job_id, "resumed_from": resumed_from, "log": log}


def _check_checkpoints(server: Server, job_id: int, stopped_at: int) -> None:
    """The job's checkpoints: the last one is the save at the stop; each one's sha256 (a
    directory's tree digest) matches what is in the storage."""
    listing = server.client.checkpoints(job_id)
    ckpts = listing["checkpoints"]
    assert ckpts[-1]["step"] == stopped_at, ckpts
    storage = open_storage(listing["directory"])
    for c in ckpts:
        assert c["algorithm"] == "sha256"
        assert storage.digest(c["path"]) == c["sha256"]
        assert storage.size(c["path"]) == c["size"]


def _steps(server: Server, job_id: int, name: str) -> list[int]:
    series = server.client.metrics(job_id, name=name)["series"]
    assert series, f"job {job_id} has no series {name}"
    return [int(p[0]) for p in series[0]["points"]]


def test_a_trainer_job_resumes_after_a_kill_and_saves_when_asked_to_stop(
    slow_stop_server: Server,
) -> None:
    server = slow_stop_server
    run = _kill_resume_and_stop(server, TRANSFORMERS, "the Trainer")
    job_id, log = run["id"], run["log"]
    # the Trainer's own count after the restart starts at the checkpoint's step
    stopped = [int(s) for s in re.findall(r"saving step (\d+) and stopping", log)]
    assert len(stopped) == 1 and stopped[0] > run["resumed_from"]
    _check_checkpoints(server, job_id, stopped[0])
    files = {
        name
        for name, _ in open_storage(server.client.checkpoints(job_id)["directory"]).files(
            f"step-{stopped[0]:09d}"
        )
    }
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= files, files
    # logging_steps=1: the Trainer logs global steps 1, 2, ...; each stored once, none missing
    steps = _steps(server, job_id, "loss")
    assert steps == list(range(1, stopped[0] + 1)), steps
    # the TrainingArguments are hparams the run reported to the server (the runs table's)
    reported = server.client.job(job_id)["hparams"]
    assert reported["learning_rate"] > 0 and reported["save_steps"] == 5, reported


def test_a_lightning_job_resumes_after_a_kill_and_saves_when_asked_to_stop(
    slow_stop_server: Server,
) -> None:
    server = slow_stop_server
    run = _kill_resume_and_stop(server, LIGHTNING, "Lightning")
    job_id, log = run["id"], run["log"]
    stopped = [int(s) for s in re.findall(r"asks this job to stop: saving step (\d+)", log)]
    assert len(stopped) == 1 and stopped[0] > run["resumed_from"]
    _check_checkpoints(server, job_id, stopped[0])
    # Lightning logs batch i at step i; the checkpoint of global step N was taken after batch
    # N - 1 and the resumed run goes on with batch N: steps 0 .. stop - 1, each once
    steps = _steps(server, job_id, "train/loss")
    assert steps == list(range(stopped[0])), steps
    # save_hyperparameters() reached the server's record of the hparams the run used
    reported = server.client.job(job_id)["hparams"]
    assert reported["hidden"] == 32 and reported["lr"] == 0.01, reported
