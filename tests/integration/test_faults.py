"""Faults injected into real jobs: failures that must not be retried, and killed ranks that
must resume as if nothing had happened."""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import marked_processes
from tests.integration.conftest import EXAMPLE, Server
from tests.integration.test_training import write_job
from trainhouse.sdk.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration


def test_a_missing_module_fails_at_once_and_show_says_why(server: Server, tmp_path: Path) -> None:
    spec = write_job(
        tmp_path,
        "import trainhouse\nimport tranformers  # a typo: retrying cannot help\n",
        "name: typo\nentrypoint: python train.py\nmax_restarts: 3\n"
        "resources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert final["state"] == "FAILED" and final["restarts"] == 0
    assert len(final["attempt_history"]) == 1
    attempt = final["attempt_history"][0]
    assert attempt["failure"] == "user" and attempt["failed_rank"] in (0, 1)
    assert "No module named 'tranformers'" in attempt["log_tail"]
    assert "not restarted: the log matches 'ModuleNotFoundError'" in final["reason"]
    shown = server.cli("show", str(job["id"])).stdout
    assert "FAILED RANK" in shown and "(code)" in shown
    assert "last lines of rank" in shown and "ModuleNotFoundError" in shown


def rank_process(job_id: int, rank: int) -> psutil.Process | None:
    """The training script's own process of one rank (not its wrapper, not torchrun)."""
    for proc in marked_processes():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            cmd = proc.cmdline()
            if (
                env.get("TRAINHOUSE_JOB_ID") == str(job_id)
                and env.get("RANK") == str(rank)
                and "train.py" in " ".join(cmd)
                and "trainhouse.executors.rank" not in cmd
            ):
                return proc
    return None


# randomness from every generator a script may use: dropout and data from torch's global RNG,
# numpy's and python's, each seeded per rank; nothing but the checkpoint carries their states
RANDOM_SCRIPT = """
import random
import time

import numpy as np
import torch
import trainhouse
from torch.nn.parallel import DistributedDataParallel as DDP

with trainhouse.init(hparams={"steps": 40, "seed": 0}) as run:
    steps = int(run.hparams["steps"])
    run.set_total_steps(steps)
    seed = int(run.hparams["seed"]) + run.rank
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = run.checkpoint.load()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    for step in range(start, steps):
        x = torch.randn(16, 8) * float(np.random.uniform(0.5, 1.5)) + random.random()
        loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss.item()}, step=step)
        if step % 5 == 4 or step == steps - 1:
            run.checkpoint.save(
                {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, step=step
            )
        time.sleep(0.05)
"""


@pytest.mark.parametrize("job", ["digits-example", "random-generators"])
def test_a_killed_rank_resumes_bit_identically(server: Server, tmp_path: Path, job: str) -> None:
    """SIGKILL one rank of a 2-rank DDP run mid-run: after the automatic restart (an
    infrastructure failure, so max_restarts: 0 is enough) the final weights and every logged
    loss equal those of an uninterrupted run with the same seed."""
    if job == "digits-example":  # the sampler's position must survive: resumed mid-epoch
        spec = EXAMPLE
        args = ["--set", "hparams.epochs=3", "--set", "hparams.checkpoint_every=8"]
        kill_at = 20
    else:  # the RNG states of every rank must survive
        spec = write_job(
            tmp_path,
            RANDOM_SCRIPT,
            "name: random\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
        )
        args, kill_at = [], 17
    args += ["--detach", "--set", "max_restarts=0"]
    clean = server.cli_json("submit", str(spec), *args)
    killed = server.cli_json("submit", str(spec), *args)
    server.wait_step(killed["id"], kill_at)
    victim = rank_process(killed["id"], 1)
    assert victim is not None
    victim.kill()
    a = server.wait(clean["id"], {"COMPLETED", "FAILED"}, timeout=400)
    b = server.wait(killed["id"], {"COMPLETED", "FAILED"}, timeout=400)
    assert a["state"] == "COMPLETED", (a["reason"], a["attempt_history"])
    assert b["state"] == "COMPLETED", (b["reason"], b["attempt_history"])
    first = b["attempt_history"][0]
    assert first["failure"] == "infra" and first["failed_rank"] == 1, first
    assert (b["restarts"], b["infra_restarts"]) == (0, 1)
    assert "=== trainhouse: attempt 2" in server.cli("logs", str(killed["id"])).stdout

    def series(job_id: int) -> list[tuple[int, float]]:
        found = server.cli_json("metrics", str(job_id))["series"]
        loss = next(s for s in found if s["name"] == "loss")
        return [(p[0], p[1]) for p in loss["points"]]

    sa, sb = series(clean["id"]), series(killed["id"])
    assert [s for s, _ in sb] == list(range(len(sb)))  # every step exactly once
    assert sb == sa  # and the same value at every step

    def final_state(job_id: int) -> dict[str, torch.Tensor]:
        listing = server.cli_json("checkpoints", str(job_id))
        last = listing["checkpoints"][-1]
        state = load_checkpoint(Path(listing["directory"]) / last["path"])
        return state["model"]  # type: ignore[no-any-return]

    wa, wb = final_state(clean["id"]), final_state(killed["id"])
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
