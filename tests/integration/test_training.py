"""End to end: a real server, real torchrun ranks over gloo, the CLI as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import torch

from tests.support.jobs import LONG_SCRIPT, write_job
from tests.support.processes import marked_processes
from tests.support.servers import EXAMPLE, Server
from trainhouse.jobfs.layout import JobLayout
from trainhouse.jobfs.storage import new_hash
from trainhouse.sdk.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration


def test_example_trains_end_to_end(server: Server) -> None:
    result = server.cli("submit", str(EXAMPLE), "--set", "hparams.epochs=3", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    job = json.loads(result.stdout)
    assert job["state"] == "COMPLETED"
    assert job["attempt_history"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    job_id = str(job["id"])

    shown = server.cli_json("show", job_id)
    assert shown["state"] == "COMPLETED" and shown["total_steps"] == shown["last_step"] + 1

    series = {s["name"]: s["points"] for s in server.cli_json("metrics", job_id)["series"]}
    loss = [v for _, v, _ in series["loss"]]
    assert len(loss) == shown["total_steps"]
    assert [s for s, _, _ in series["loss"]] == list(range(len(loss)))  # each step once
    assert sum(loss[-10:]) / 10 < sum(loss[:10]) / 10  # it learns
    assert len(series["val_acc"]) == 3

    ckpts = server.cli_json("checkpoints", job_id)
    assert [c["step"] for c in ckpts["checkpoints"]]  # keep_last=2 + keep_best=1
    latest = ckpts["checkpoints"][-1]
    path = Path(ckpts["directory"]) / latest["path"]
    hasher = new_hash(latest["algorithm"])
    hasher.update(path.read_bytes())
    assert latest["algorithm"] == "blake3" and hasher.hexdigest() == latest["sha256"]
    assert path.stat().st_size == latest["size"]
    state = load_checkpoint(path)
    assert state["epoch"] == 2 and "conv1.weight" in state["model"]

    for rank in ("0", "1"):
        log = server.cli("logs", job_id, "--rank", rank)
        assert log.returncode == 0
        assert f"rank {rank}/2: " in log.stdout
    both = server.cli("logs", job_id, "--tail", "2")
    assert "[rank 0]" in both.stdout and "[rank 1]" in both.stdout
    listing = server.cli("ps", "--all")
    assert "digits-cnn" in listing.stdout and "COMPLETED" in listing.stdout


def test_cancel_leaves_no_process(server: Server, tmp_path: Path) -> None:
    spec = write_job(
        tmp_path,
        LONG_SCRIPT,
        """
        name: forever
        entrypoint: python train.py
        resources: {procs_per_node: 2}
    """,
    )
    job = server.cli_json("submit", str(spec), "--detach")
    attempt = server.wait_step(job["id"], 3)["attempt_history"][0]
    launcher = psutil.Process(attempt["pid"])
    family = [launcher, *launcher.children(recursive=True)]
    assert len([p for p in family if "train.py" in " ".join(p.cmdline())]) >= 2

    result = server.cli("cancel", str(job["id"]))
    assert result.returncode == 0, result.stderr
    assert "CANCELED" in result.stdout
    _gone, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, f"processes of the canceled job survived: {alive}"
    assert not marked_processes()
    final = server.cli_json("show", str(job["id"]))
    assert final["state"] == "CANCELED"
    assert final["attempt_history"][0]["result"] == "canceled"
    # should_stop() told every rank, and they exited cleanly at the same step
    assert final["attempt_history"][0]["rank_exit_codes"] == {"0": 0, "1": 0}
    logs = [server.cli("logs", str(job["id"]), "--rank", r).stdout for r in ("0", "1")]
    steps = [int(text.split("stopping at step ")[1].split()[0]) for text in logs]
    assert steps[0] == steps[1]


RESUME_SCRIPT = """
import os
import torch
import trainhouse
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 12
with trainhouse.init(total_steps=STEPS) as run:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model) if run.world_size > 1 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    start = 0
    state = run.checkpoint.load()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    print(f"rank {run.rank} attempt {run.attempt} starts at step {start}", flush=True)
    crash_at = int(run.hparams.get("crash_at", -1))
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * step + run.rank)
        x = torch.randn(16, 4, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss.item()}, step=step)
        run.checkpoint.save(
            {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step=step
        )
        if step == crash_at and run.attempt == 1 and run.rank == 1:
            os._exit(7)
"""


def test_failed_rank_restarts_from_checkpoint_and_resumes_exactly(
    server: Server, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path,
        RESUME_SCRIPT,
        """
        name: resume
        entrypoint: python train.py
        resources: {procs_per_node: 2}
        max_restarts: 1
    """,
    )
    clean = server.cli_json("submit", str(spec), "--detach")
    crashed = server.cli_json("submit", str(spec), "--detach", "--set", "hparams.crash_at=5")
    a = server.wait(clean["id"], {"COMPLETED", "FAILED"})
    b = server.wait(crashed["id"], {"COMPLETED", "FAILED"})
    assert a["state"] == "COMPLETED", a
    assert b["state"] == "COMPLETED", b
    history = b["attempt_history"]
    assert [h["result"] for h in history] == ["failed", "completed"]
    assert history[0]["rank_exit_codes"]["1"] == 7
    assert "rank 1 exited with code 7" in history[0]["reason"]
    assert b["restarts"] == 1
    log = server.cli("logs", str(crashed["id"]), "--rank", "0").stdout
    assert "attempt 2 starts at step 6" in log
    # the SDK records each rank's clean finish for its wrapper (never the crashed rank's)
    job = JobLayout(server.home, crashed["id"])
    assert not job.attempt(1).rank_finished(1).exists()
    assert job.attempt(2).rank_finished(0).is_file() and job.attempt(2).rank_finished(1).is_file()

    points = server.cli_json("metrics", str(crashed["id"]))["series"][0]["points"]
    assert [p[0] for p in points] == list(range(12))  # every step exactly once

    def final_weights(job_id: int) -> dict[str, torch.Tensor]:
        ck = server.cli_json("checkpoints", str(job_id))
        last = ck["checkpoints"][-1]
        assert last["step"] == 11
        weights: dict[str, torch.Tensor] = load_checkpoint(Path(ck["directory"]) / last["path"])[
            "model"
        ]
        return weights

    wa, wb = final_weights(clean["id"]), final_weights(crashed["id"])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_postgres_backed_server(tmp_path: Path, pg_url: str) -> None:
    from tests.support.servers import assert_clean_stop, start_server

    srv = start_server(tmp_path / "pghome", "--db", pg_url, "--cpus", "2")
    try:
        spec = write_job(
            tmp_path,
            "print('hello from postgres')\n",
            """
            name: pg
            entrypoint: python train.py
        """,
        )
        result = srv.cli("submit", str(spec), "--json")
        assert result.returncode == 0, result.stderr
        job = json.loads(result.stdout)
        assert job["state"] == "COMPLETED"
        assert "hello from postgres" in srv.cli("logs", str(job["id"])).stdout
        assert not (tmp_path / "pghome" / "trainhouse.db").exists()
    finally:
        assert_clean_stop(srv)
