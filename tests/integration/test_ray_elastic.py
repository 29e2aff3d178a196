"""An elastic multi-node job on a real (local) Ray cluster follows the nodes the cluster has:
it starts on the nodes there are, grows onto a node that joins (after its ``resize_interval``,
at a checkpoint: the attempt ends ``resized``), and when a node it runs on leaves, the attempt
fails as the infrastructure's and the job restarts from its checkpoint on the nodes left. DDP
over gloo across the nodes, every sample of every epoch seen exactly once across the sizes.

Its own cluster (:mod:`tests.support.raycluster`): a head and one worker of one CPU each; the
test adds a second worker and removes it again (a node it adds is its child, which it must end
itself)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import ELASTIC, write_job
from tests.support.processes import marked_processes
from tests.support.raycluster import (
    RayCluster,
    agents,
    node_caches,
    ray_server,
    running_ray_cluster,
    wait_gone,
)
from tests.support.servers import Server, assert_clean_stop

# one Ray cluster at a time: under pytest-xdist with test_ray.py's, on one worker
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-cluster")]
__all__ = ["node_caches"]  # a fixture of tests.support.raycluster

# nodes of one CPU each: one rank per node, the least of its range (the executor runs the size
# it was placed at, not the most its spec allows); batches of 6 samples: what 2 or 3 ranks
# consume divides 240, so a resumed epoch splits among either without padding (a repeated
# sample would show); the test paces it through its gate file (hparams.gate), so that each node
# joins and leaves with work left
SPEC = """
name: ray-elastic
entrypoint: python train.py
resources: {nodes: "1:3", procs_per_node: "1:2", cpus_per_proc: 1}
resize_interval: 3s
preemption_grace: 60
max_restarts: 0
hparams: {epochs: 2, n: 240, batch: 6, sleep: 0.05, every: 3, gate: GATE}
"""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    with running_ray_cluster(head_cpus=1, workers={"worker_a": 1}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ray-elastic")
    srv = ray_server(root / "home", ray_cluster, "--checkpoint-url", str(root / "ckpt"))
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def open_gate(gate: Path, upto: int | None) -> None:
    """Let the job train up to step ``upto`` (None: to its end)."""
    tmp = gate.with_suffix(".new")
    tmp.write_text("" if upto is None else str(upto))
    tmp.replace(gate)


def nodes_of(record: dict[str, Any]) -> list[str]:
    """The nodes of a job's or an attempt's placement, in node rank order."""
    return [p["node"] for p in (record["placement"] or {"nodes": []})["nodes"]]


def wait_training(srv: Server, job_id: int, attempt: int, step: int) -> dict[str, Any]:
    """Wait until ``attempt`` of the job runs and the job has reported ``step``; failing at
    once if a later attempt started instead."""
    deadline = time.monotonic() + 120
    with srv.client as c:
        while True:
            job = c.job(job_id)
            running = job["attempts"] == attempt and job["state"] == "RUNNING"
            if running and (job.get("last_step") or 0) >= step:
                return dict(job)
            assert job["attempts"] <= attempt, history(dict(job))
            assert time.monotonic() < deadline, f"attempt {attempt} never reached step {step}"
            time.sleep(0.2)


def history(job: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each attempt's result, reason and nodes (for a failure's message)."""
    return [(a["result"], a["reason"], nodes_of(a)) for a in job["attempt_history"]]


def rank0_log(srv: Server, job_id: int) -> str:
    with srv.client as c:
        return str(c.logs(job_id, rank=0)[0])


def started_at_step(log: str, attempt: int) -> int:
    """The step ``attempt`` resumed at, as rank 0 printed it."""
    line = next(ln for ln in log.splitlines() if f"rank 0 attempt {attempt} world " in ln)
    return int(line.rsplit(" step ", 1)[1])


def test_an_elastic_job_grows_onto_a_joining_node_and_restarts_smaller_when_one_leaves(
    server: Server, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    open_gate(gate, 6)
    spec = write_job(tmp_path, ELASTIC, SPEC.replace("GATE", json.dumps(str(gate))))
    job = server.cli_json("submit", str(spec), "--detach")
    first = wait_training(server, job["id"], 1, 2)
    assert len(nodes_of(first)) == 2, first["placement"]  # the nodes there are: head, worker_a

    ray_cluster.add_worker("worker_b")  # the job grows onto it after its resize_interval
    try:
        log = ""
        deadline = time.monotonic() + 120
        while "rank 0 stops at step" not in log:
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(0.3)
            log = rank0_log(server, job["id"])
        stopped = int(log.split("rank 0 stops at step ")[1].split(":")[0])
        assert stopped <= 6, log[-3000:]
        # the next attempt trains on all three nodes, past a checkpoint of its own (every 3
        # steps), and waits at the gate
        open_gate(gate, stopped + 4)
        grown = wait_training(server, job["id"], 2, stopped + 4)
        assert [ray_cluster.worker_of(n) for n in nodes_of(grown)].count("worker_b") == 1, grown
        assert len(nodes_of(grown)) == 3, grown["placement"]

        ray_cluster.remove("worker_b")  # a node the job runs on leaves
        wait_training(server, job["id"], 3, 0)
        open_gate(gate, None)
        final = server.wait(job["id"], {"COMPLETED", "FAILED", "CANCELED"}, timeout=180)
        assert final["state"] == "COMPLETED", final["reason"]
    finally:
        if "worker_b" in ray_cluster.workers:  # the test failed before: no node outlives it
            ray_cluster.remove("worker_b")

    attempts = final["attempt_history"]
    assert [a["result"] for a in attempts] == ["resized", "failed", "completed"], history(final)
    assert [len(nodes_of(a)) for a in attempts] == [2, 3, 2], history(final)
    assert attempts[0]["reason"] == "grew 2->3: 1 CPU cores freed", attempts[0]
    assert attempts[0]["rank_exit_codes"] == {"0": 0, "1": 0}  # it yielded at a checkpoint
    lost = [ray_cluster.worker_of(n) for n in nodes_of(attempts[1])].index("worker_b")
    assert (attempts[1]["failure"], attempts[1]["failed_rank"]) == ("infra", lost), attempts[1]
    assert all(ray_cluster.worker_of(n) != "worker_b" for n in nodes_of(attempts[2]))
    # a resize is no restart; the lost node is the infrastructure's (max_infra_restarts)
    assert final["restarts"] == 0 and final["infra_restarts"] == 1, final

    log = rank0_log(server, job["id"])
    assert "rank 0 attempt 1 world 2 resized False previous None" in log, log[-3000:]
    assert "rank 0 attempt 2 world 3 resized True previous 2" in log, log[-3000:]
    assert "rank 0 attempt 3 world 2 resized True previous 3" in log, log[-3000:]
    assert "resize: grew 2->3" in log, log[-3000:]  # run.stop_reason
    # each attempt resumed from the job's latest checkpoint: the grown one from the one it
    # stopped at, the restart from one the grown attempt saved (at most 3 steps before the gate)
    assert started_at_step(log, 2) == stopped + 1
    resumed = started_at_step(log, 3)
    assert stopped + 1 < resumed <= stopped + 4, log[-3000:]
    for epoch in range(2):  # seen by the last attempt only, each sample once
        assert log.count(f"epoch {epoch}: ") == 1, log[-3000:]
        assert f"epoch {epoch}: 240 samples, each once: True" in log, log[-3000:]
    # the stored series is the lineage of the final state: each step once, logged at the size
    # of the attempt whose work it kept (the grown attempt's steps after its checkpoint were
    # done again by the restart)
    series = server.cli_json("metrics", str(job["id"]))["series"]
    world = next(s for s in series if s["name"] == "world")["points"]
    assert [p[0] for p in world] == list(range(len(world)))
    sizes = [int(p[1]) for p in world]
    assert sizes == [2] * (stopped + 1) + [3] * (resumed - stopped - 1) + [2] * (
        len(world) - resumed
    ), sizes
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)
