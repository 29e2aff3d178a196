"""The Ray executor's pieces that need no cluster: Ray's nodes as scheduler nodes, the ranks per
node of an attempt, what an attempt makes of its nodes' reports, the guard that outlives a node
agent, the refusal of a multi-node job without shared checkpoints, and an unplaced attempt going
back to the queue."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from tests.support.fakes import FakeExecutor
from tests.support.records import stored_archive
from trainhouse.core.cluster import Node, Placement
from trainhouse.errors import ResourceError
from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.executors.ray.attempt import (
    Attempt,
    Member,
    node_name,
    pack,
    ranks_per_node,
    to_node,
)
from trainhouse.executors.ray.node import interface_of, socket_interfaces
from trainhouse.jobfs.layout import MARKER_ENV, JobLayout
from trainhouse.lifecycle import JobState
from trainhouse.scheduler.failures import analyse
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.spec import NoRestart
from trainhouse.store import BlobStore, Store
from trainhouse.usecases.settings import Settings
from trainhouse.usecases.submission import schedulable_spec

RAW = {
    "NodeID": "ab12cd34" + "0" * 48,
    "Alive": True,
    "NodeManagerHostname": "gpu-7",
    "NodeManagerAddress": "10.0.0.7",
    "Resources": {
        "CPU": 16.0,
        "GPU": 4.0,
        "memory": 64e9,
        "object_store_memory": 1e9,
        "node:10.0.0.7": 1.0,
        "accelerator_type:H100": 1.0,
        "nvlink": 1.0,
        "CPU_group_0_abc": 2.0,
    },
}


def test_a_ray_node_as_a_scheduler_node() -> None:
    node = to_node(RAW, None)
    assert node.name == "gpu-7-ab12cd34" == node_name(RAW)
    assert (node.cpus, len(node.gpus), node.gpus[0].model) == (16, 4, "H100")
    assert node.labels == ("nvlink=1",)  # custom resources; Ray's own are left out
    busy = to_node(RAW, {"CPU": 5.5, "GPU": 1.0})  # what is free (fractions round down)
    assert (busy.cpus, len(busy.gpus)) == (5, 1)


def attempt(tmp_path: Path, nodes: int = 2, procs: int = 1) -> Attempt:
    att = Attempt(7, 1, JobLayout(tmp_path, 7), procs, [Member(i) for i in range(nodes)])
    att.logs.mkdir(parents=True)
    att.layout.dir.mkdir(parents=True)
    return att


def status(logs: dict[str, tuple[int, bytes]], **kw: Any) -> dict[str, Any]:
    return {"started": True, "ended": False, "complete": False, "logs": logs, **kw}


def test_logs_are_appended_once_each(tmp_path: Path) -> None:
    att = attempt(tmp_path)
    first, second = att.members
    assert att.absorb(first, status({"rank-0.log": (0, b"step 1\n")})) is None
    att.absorb(first, status({"rank-0.log": (0, b"step 1\nstep 2\n")}))  # asked twice
    att.absorb(second, status({"launcher.log": (0, b"torchrun says\n")}))
    assert (att.logs / "rank-0.log").read_bytes() == b"step 1\nstep 2\n"
    assert (att.logs / "launcher.log").read_bytes() == b"[node 1] torchrun says\n"
    att.save_record()
    again = Attempt.load(7, 1, att.job)
    assert again.members[0].offsets == {"rank-0.log": 14}  # a restarted server goes on here


def test_an_ended_node_brings_its_exit_codes_and_spooled_metrics(tmp_path: Path) -> None:
    att = attempt(tmp_path)
    first, second = att.members
    done = status(
        {},
        ended=True,
        complete=True,
        launcher=(0, 100.0),
        ranks={"0": (0, 99.0)},
        spool={"1-batch.json": b"{}"},
    )
    assert att.absorb(first, done) is None
    assert first.done and (att.layout.spool / "1-batch.json").exists()
    failed = status({}, ended=True, complete=True, launcher=(1, 98.0), ranks={"1": (3, 97.0)})
    assert att.absorb(second, failed) == "node 1's torchrun exited with code 1"
    ended = att.result()
    assert ended.exit_code == 1 and ended.failed_rank == 1
    assert ended.rank_exit_codes == {"0": 0, "1": 3}


def test_a_lost_node_is_an_infrastructure_failure_of_its_ranks(tmp_path: Path) -> None:
    att = attempt(tmp_path, nodes=2, procs=2)
    first, second = att.members
    # node 0's ranks failed (their peers vanished) before the loss was noticed
    att.absorb(
        first,
        status(
            {"rank-0.log": (0, b"=== trainhouse: attempt 1, rank 0 ===\nRuntimeError: gloo\n")},
            ended=True,
            complete=True,
            launcher=(1, 50.0),
            ranks={"0": (1, 49.0), "1": (1, 49.5)},
        ),
    )
    second.lost = "gpu-7-ab12cd34 left the Ray cluster"
    ended = att.result()
    assert ended.rank_exit_codes == {"0": 1, "1": 1, "2": -9, "3": -9}
    assert ended.failed_rank == 2  # the lost node's, taken as the first to fail
    failure = analyse(ended, JobLayout(tmp_path, 7), 2, NoRestart())
    assert failure.kind == "infra", failure
    assert "left the Ray cluster" in (att.logs / "rank-2.log").read_text()


def test_an_attempt_runs_the_ranks_it_was_placed_with() -> None:
    """An elastic job's attempt runs at the size the scheduler placed it at (here 2 ranks on
    each of 3 nodes), not at its spec's largest; torchrun's static rendezvous needs as many
    ranks on every node."""
    three = tuple(Placement(f"n{i}", cpus=2, procs=2) for i in range(3))
    assert ranks_per_node(three) == 2
    with pytest.raises(ValueError, match="n0: 2, n1: 2, n2: 3"):
        ranks_per_node((*three[:2], Placement("n2", cpus=3, procs=3)))


def test_a_killed_torchrun_takes_its_ranks_with_it(tmp_path: Path) -> None:
    att = attempt(tmp_path, nodes=2, procs=1)
    first, second = att.members
    ends = {"ended": True, "complete": True}
    att.absorb(first, status({}, **ends, launcher=(1, 60.0), ranks={"0": (1, 59.0)}))
    assert att.absorb(second, status({}, **ends, launcher=(-9, 50.0), ranks={}))
    ended = att.result()
    assert ended.rank_exit_codes == {"0": 1, "1": -9} and ended.failed_rank == 1
    assert analyse(ended, JobLayout(tmp_path, 7), 1, NoRestart()).kind == "infra"


def test_the_guard_kills_the_nodes_processes_when_its_agent_dies(tmp_path: Path) -> None:
    marker = f"test-guard-{os.getpid()}"
    root = tmp_path / "trainhouse-ray" / "attempt"
    (root / "logs").mkdir(parents=True)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, MARKER_ENV: marker},
        start_new_session=True,
    )
    read_end, write_end = os.pipe()
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trainhouse.executors.ray.node",
                "guard",
                str(read_end),
                marker,
                str(root),
                str(root.parent),
            ],
            pass_fds=(read_end,),
            check=True,
            timeout=30,
        )
        os.close(read_end)
        time.sleep(0.3)
        assert sleeper.poll() is None  # the guard waits while the agent lives
        guards = [
            p
            for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])
        ]
        assert len(guards) == 1
        os.close(write_end)  # the agent is gone
        assert sleeper.wait(timeout=15) == -signal.SIGKILL
        psutil.wait_procs(guards, timeout=15)
        assert not (tmp_path / "trainhouse-ray").exists()  # its directory went with it
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_pack_keeps_every_file(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.py").write_text("x")
    (tmp_path / ".hidden").write_text("y")
    with tarfile.open(fileobj=io.BytesIO(pack(tmp_path)), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == [".hidden", "a/b/x.py"]


class MultiNode:
    multi_node = True

    def __init__(self, free: int) -> None:
        self.free = free

    def capacity(self) -> list[Node]:
        return [Node(f"n{i}", 4, 1 << 30) for i in range(3)]

    def nodes(self) -> list[Node]:
        return self.capacity()[: self.free]


SPEC = "entrypoint: python train.py\nresources: {nodes: 2}\n"


def services(tmp_path: Path, **settings: Any) -> Any:
    return SimpleNamespace(
        scheduler=SimpleNamespace(executor=MultiNode(free=1)),
        settings=Settings(home=tmp_path, **settings),
    )


def test_a_multi_node_job_needs_checkpoints_every_node_reaches(tmp_path: Path) -> None:
    with pytest.raises(ResourceError, match="--checkpoint-url") as err:
        schedulable_spec(services(tmp_path), SPEC)
    assert "resources.nodes is 2" in str(err.value)
    # a shared directory, a URL, or a HOME every node mounts will do; busy nodes do not matter
    assert schedulable_spec(services(tmp_path, checkpoint_url="s3://b/p"), SPEC)
    assert schedulable_spec(services(tmp_path, shared_home=True), SPEC)
    one = schedulable_spec(services(tmp_path), SPEC.replace("nodes: 2", "nodes: 1"))
    assert one.resources.nodes == 1


def test_the_advertised_url_is_what_ranks_report_to(tmp_path: Path) -> None:
    assert Settings(home=tmp_path, host="0.0.0.0", port=9).url == "http://127.0.0.1:9"
    remote = Settings(home=tmp_path, host="0.0.0.0", advertise_url="http://head:8470/")
    assert remote.url == "http://head:8470"


class Unplaceable(FakeExecutor):
    """Launches, then reports that the attempt never started."""

    def launch(self, launch: Launch) -> ProcessInfo:
        self.live[launch.job_id] = launch.attempt
        self.exits.append(
            Exit(launch.job_id, launch.attempt, 1, requeue="Ray could not place it in 60 s")
        )
        return ProcessInfo(0, 0.0)


def test_an_unplaced_attempt_goes_back_to_the_queue_without_a_restart(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        blobs = BlobStore(tmp_path / "blobs")
        digest = stored_archive(blobs)
        sched = SchedulerLoop(store, blobs, Unplaceable(), home=tmp_path, server_url="http://x")
        spec = {"entrypoint": "python train.py", "max_restarts": 0}
        job_id = store.jobs.create(
            name="j", owner="ann", priority="normal", spec=spec, archive_sha256=digest
        ).id
        sched.tick()  # started
        sched.tick()  # its exit says it never started: requeued, then started again
        job = store.jobs.get(job_id)
        first = store.jobs.attempts(job_id)[0]
        assert (first.result, first.reason) == ("unplaced", "Ray could not place it in 60 s")
        assert job.state in (JobState.QUEUED, JobState.RUNNING)
        assert (job.restarts, job.infra_restarts) == (0, 0)
    finally:
        store.close()


def test_ranks_are_told_the_interface_of_the_nodes_ray_address() -> None:
    """Issue 20 item 9: gloo binds to what the hostname resolves to (127.0.1.1 on Debian) and
    NCCL picks a network of its own unless told; a node's ranks are told the interface that
    holds its Ray address, unless the node or the spec already chose one."""
    assert interface_of("127.0.0.1") == "lo"
    assert socket_interfaces("127.0.0.1", {}) == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }
    assert socket_interfaces("127.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"}) == {
        "GLOO_SOCKET_IFNAME": "lo"
    }
    assert socket_interfaces("198.51.100.254", {}) == {}  # an address no interface holds


def test_a_nodes_job_caches_are_pruned_after_days_unused(tmp_path: Path) -> None:
    """A Ray node keeps each job's compilers' caches across its attempts; it cannot know when
    a job ended for good, so caches unused for a week go when another attempt starts there."""
    from trainhouse.executors.ray.node import CACHE_IDLE, prune_caches

    caches = tmp_path / "caches"
    for name in ("old", "recent", "mine"):
        (caches / name / "inductor").mkdir(parents=True)
    week_ago = time.time() - CACHE_IDLE - 60
    for name in ("old", "mine"):
        os.utime(caches / name, (week_ago, week_ago))
    (caches / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    assert prune_caches(caches, keep=caches / "mine") == 1
    assert sorted(p.name for p in caches.iterdir()) == ["link", "mine", "recent"]
    assert (tmp_path / "elsewhere").is_dir()
