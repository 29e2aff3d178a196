"""Resume and clone end to end: a real server, real ranks, the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import RESUMABLE, write_job
from tests.support.servers import Server

pytestmark = pytest.mark.integration


def test_a_canceled_job_resumes_and_a_clone_starts_from_its_checkpoint(
    server: Server, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path,
        RESUMABLE,
        """
        name: lineage
        entrypoint: python train.py
        resources: {procs_per_node: 1}
        hparams: {steps: 20}
        checkpoints: {keep_last: 2}
        """,
    )
    c = server.client
    job = c.submit(spec)
    job_id = str(job["id"])
    server.wait_step(job["id"], 6)
    c.cancel(job["id"])
    canceled = server.wait(job["id"], {"CANCELED"})
    saved = max(ck["step"] for ck in c.checkpoints(job["id"])["checkpoints"])
    assert saved >= 5

    # resume: the same job, back in the queue, continuing after its latest checkpoint
    result = server.cli("resume", job_id, "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    resumed = json.loads(result.stdout)
    assert resumed["id"] == job["id"] and resumed["state"] == "COMPLETED"
    assert resumed["resumes"] == 1 and resumed["attempts"] == canceled["attempts"] + 1
    log, _, _ = c.logs(job["id"], rank=0)
    assert f"attempt {resumed['attempts']} starts at step {saved + 1}" in log
    loss = c.metrics(job["id"], name="loss")["series"][0]["points"]
    assert [p[0] for p in loss] == list(range(20))  # every step once, across both runs

    # a completed job is not resumed; the refusal says what to do instead
    again = server.cli("resume", job_id)
    assert again.returncode != 0
    assert f"it completed; `trainhouse clone {job_id} --from-checkpoint latest`" in (
        again.stderr + again.stdout
    )

    # clone: a new job with the same code and more steps, from a copy of the last checkpoint
    last = max(ck["step"] for ck in c.checkpoints(job["id"])["checkpoints"])
    result = server.cli(
        "clone", job_id, "--set", "hparams.steps=24", "--from-checkpoint", "latest", "--json"
    )
    assert result.returncode == 0, result.stderr + result.stdout
    clone = json.loads(result.stdout)
    assert clone["id"] != job["id"] and clone["state"] == "COMPLETED"
    assert (clone["cloned_from"], clone["cloned_step"]) == (job["id"], last)
    assert clone["archive_sha256"] == resumed["archive_sha256"]
    clone_log, _, _ = c.logs(clone["id"], rank=0)
    assert f"attempt 1 starts at step {last + 1}" in clone_log
    steps = [p[0] for p in c.metrics(clone["id"], name="loss")["series"][0]["points"]]
    assert steps == list(range(last + 1, 24))
    assert [x["id"] for x in c.job(job["id"])["clones"]] == [clone["id"]]
    shown = server.cli("show", str(clone["id"])).stdout
    assert f"job {job_id}, starting from its checkpoint of step {last}" in shown
    c.close()
