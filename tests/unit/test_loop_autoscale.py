"""The scheduler loop asking an executor with an autoscaler for nodes: what it hands the
executor at each tick (the pure choice of :mod:`trainhouse.scheduler.capacity`), the note it
appends to a waiting job's reason, the withdrawal once nothing waits, and a tick that goes on
when asking fails. The Ray side against Ray's real autoscaler: tests/integration/
test_autoscaler.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fakes import FakeExecutor
from tests.support.records import stored_archive
from trainhouse.core.cluster import Node, NodeType, Wants
from trainhouse.lifecycle import JobState
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.store import BlobStore, Store


class GrowingExecutor(FakeExecutor):
    """The fake executor on a cluster whose autoscaler can add two 8-core nodes."""

    def __init__(self) -> None:
        super().__init__(Node("head", 4, 1 << 30))
        self.asked: list[Wants] = []
        self.broken = False
        self.digest = ""  # the stored workdir archive of the test's jobs

    def launchable(self) -> tuple[list[NodeType], int | None]:
        return [NodeType("cpu-8", 8, 0, max_workers=2)], None

    def request_capacity(self, wants: Wants) -> dict[int, str]:
        if self.broken:
            raise RuntimeError("the GCS does not answer")
        self.asked.append(wants)
        return {w.job: f"waiting for {w.nodes} node(s) of type {w.node_type}" for w in wants.jobs}


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[SchedulerLoop, GrowingExecutor]]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    blobs = BlobStore(tmp_path / "blobs")
    digest = stored_archive(blobs)
    executor = GrowingExecutor()
    sched = SchedulerLoop(store, blobs, executor, home=tmp_path, server_url="http://x")
    executor.digest = digest
    yield sched, executor
    store.close()


def submit(sched: SchedulerLoop, ex: GrowingExecutor, cpus: int) -> int:
    spec = {
        "entrypoint": "python train.py",
        "resources": {"nodes": 1, "procs_per_node": 1, "cpus_per_proc": cpus},
    }
    job = sched.store.jobs.create(
        name="j", owner="ann", priority="normal", spec=spec, archive_sha256=ex.digest
    )
    return int(job.id)


def test_a_job_that_lacks_a_node_is_asked_for_and_withdrawn_when_canceled(
    loop: tuple[SchedulerLoop, GrowingExecutor],
) -> None:
    sched, ex = loop
    small, big = submit(sched, ex, 2), submit(sched, ex, 8)
    sched.tick()
    assert ex.running() == {small}  # it fit the head
    wants = ex.asked[-1]
    assert [(w.job, w.node_type, w.nodes) for w in wants.jobs] == [(big, "cpu-8", 1)]
    assert wants.bundles() == [{"CPU": 2.0}, {"CPU": 8.0}]  # what runs, then what it lacks
    assert sched.waiting[big].endswith("; waiting for 1 node(s) of type cpu-8")
    assert sched.store.jobs.get(big).reason == sched.waiting[big]
    sched.store.jobs.update(big, cancel_requested=True)
    sched.tick()
    assert sched.store.jobs.get(big).state is JobState.CANCELED
    assert ex.asked[-1].bundles() == []  # withdrawn: the queue is empty


def test_the_queue_goes_on_when_asking_fails(
    loop: tuple[SchedulerLoop, GrowingExecutor],
) -> None:
    sched, ex = loop
    ex.broken = True
    big, small = submit(sched, ex, 8), submit(sched, ex, 2)
    sched.tick()
    assert ex.running() == {small}
    assert "cpu-8" not in sched.waiting[big]
