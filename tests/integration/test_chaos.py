"""The whole promise at once: ranks, launchers and the server SIGKILLed at random moments of one
run. The job must complete with the same weights and the same loss at every step as an
undisturbed run, every step stored once, every listed checkpoint intact, no process left."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import psutil
import pytest
import torch

from tests.support.jobs import RANDOM_SCRIPT, rank_process, write_job
from tests.support.processes import marked_processes
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.jobfs.storage import new_hash
from trainhouse.sdk.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration

STEPS = 90


def launcher(job_id: int) -> psutil.Process | None:
    for proc in marked_processes():
        try:
            if proc.environ().get("TRAINHOUSE_JOB_ID") == str(job_id) and any(
                "torch.distributed.run" in part for part in proc.cmdline()
            ):
                return proc
        except psutil.Error:
            continue
    return None


def loss_series(srv: Server, job_id: int) -> list[tuple[int, float]]:
    found = srv.cli_json("metrics", str(job_id))["series"]
    return [(p[0], p[1]) for p in next(s for s in found if s["name"] == "loss")["points"]]


def final_model(srv: Server, job_id: int) -> dict[str, torch.Tensor]:
    listing = srv.cli_json("checkpoints", str(job_id))
    state = load_checkpoint(Path(listing["directory"]) / listing["checkpoints"][-1]["path"])
    return state["model"]  # type: ignore[no-any-return]


# more seeds: TRAINHOUSE_CHAOS_SEEDS=1,2,3,4 pytest tests/integration/test_chaos.py
SEEDS = [int(s) for s in os.environ.get("TRAINHOUSE_CHAOS_SEEDS", "1").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_kills_change_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    spec = write_job(
        tmp_path,
        RANDOM_SCRIPT,
        "name: chaos\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
    )
    args = ["--detach", "--set", f"hparams.steps={STEPS}"]
    try:
        clean = srv.cli_json("submit", str(spec), *args)
        srv.wait(clean["id"], {"COMPLETED"}, timeout=300)
        job = srv.cli_json("submit", str(spec), *args)["id"]
        faults = ["rank", "server", "launcher", "server+rank", "rank"]
        moments = sorted(rng.sample(range(8, STEPS - 10), len(faults)))
        done = []
        for fault, step in zip(faults, moments, strict=True):
            srv.wait_step(job, step, timeout=300)
            if "rank" in fault:
                victim = None
                while victim is None:  # it may be between attempts right now
                    victim = rank_process(job, rng.choice([0, 1]))
                victim.kill()
            if fault == "launcher":
                proc = launcher(job)
                assert proc is not None
                proc.kill()
            if "server" in fault:
                assert srv.proc is not None
                srv.proc.send_signal(signal.SIGKILL)
                srv.proc.wait()
                srv = start_server(home, "--cpus", "2", port=srv.port)
            done.append(f"{fault}@{step}")
        final = srv.wait(job, {"COMPLETED", "FAILED"}, timeout=400)
        assert final["state"] == "COMPLETED", (done, final)
        assert final["restarts"] == 0  # every failure was the infrastructure's

        series = loss_series(srv, job)
        assert [s for s, _ in series] == list(range(STEPS)), done  # each step exactly once
        assert series == loss_series(srv, clean["id"]), done  # the same value at every step
        wa, wb = final_model(srv, clean["id"]), final_model(srv, job)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), done

        listing = srv.cli_json("checkpoints", str(job))
        for ck in listing["checkpoints"]:  # every checkpoint marked complete is intact
            data = (Path(listing["directory"]) / ck["path"]).read_bytes()
            hasher = new_hash(ck["algorithm"])  # blake3 for file checkpoints
            hasher.update(data)
            assert hasher.hexdigest() == ck["sha256"], ck
        assert not marked_processes()
    finally:
        assert_clean_stop(srv)
    assert not marked_processes()
