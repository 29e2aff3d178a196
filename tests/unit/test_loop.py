"""The scheduler loop against a fake executor: no job is ever stranded in RUNNING."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.fakes import FakeExecutor
from tests.support.records import stored_archive
from trainhouse.core.cluster import Node
from trainhouse.executors.base import Exit
from trainhouse.jobfs.layout import JobLayout
from trainhouse.lifecycle import JobState
from trainhouse.scheduler.loop import SchedulerConfig, SchedulerLoop, with_held_gpus
from trainhouse.scheduler.policy import QueuedJob, Snapshot, decide
from trainhouse.scheduler.resources import Demand
from trainhouse.store import BlobStore, Store


@pytest.fixture
def loop(tmp_path: Path) -> tuple[SchedulerLoop, FakeExecutor]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    blobs = BlobStore(tmp_path / "blobs")
    digest = stored_archive(blobs)
    executor = FakeExecutor()
    sched = SchedulerLoop(store, blobs, executor, home=tmp_path, server_url="http://x")
    sched.digest = digest  # type: ignore[attr-defined]
    yield sched, executor
    store.close()


def submit(sched: SchedulerLoop, max_restarts: int = 0) -> int:
    spec = {
        "entrypoint": "python train.py",
        "max_restarts": max_restarts,
        "resources": {"nodes": 1, "procs_per_node": 1, "gpus_per_node": 0, "cpus_per_proc": 1},
    }
    return sched.store.jobs.create(
        name="j", owner="ann", priority="normal", spec=spec, archive_sha256=sched.digest
    ).id  # type: ignore[attr-defined]


def test_a_failure_while_recording_an_exit_does_not_strand_jobs(
    loop: tuple[SchedulerLoop, FakeExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: one exception in _record_exit left every other ended job RUNNING."""
    sched, ex = loop
    a, b = submit(sched), submit(sched)
    sched.tick()
    assert ex.running() == {a, b}
    real = sched.store.jobs.update_attempt
    calls = {"n": 0}

    def flaky(job_id: int, number: int, **fields: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database is locked")
        real(job_id, number, **fields)

    monkeypatch.setattr(sched.store.jobs, "update_attempt", flaky)
    ex.end(a, 0)
    ex.end(b, 0)
    sched.tick()  # a's record fails; b's is still recorded
    states = {j: sched.store.jobs.get(j).state for j in (a, b)}
    assert JobState.COMPLETED in states.values()
    stranded = next(j for j, s in states.items() if s is not JobState.COMPLETED)
    sched.tick()  # the sweep finds the RUNNING job without a process and requeues it
    job = sched.store.jobs.get(stranded)
    assert job.state in (JobState.QUEUED, JobState.RUNNING)
    assert job.attempts == 2 or sched.store.jobs.attempts(stranded)[0].result == "lost"


def test_cancel_during_a_restart_ends_the_job(
    loop: tuple[SchedulerLoop, FakeExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a cancel that landed between RESTARTING and QUEUED was lost."""
    sched, ex = loop
    job_id = submit(sched, max_restarts=3)
    sched.tick()
    real = sched.store.jobs.transition

    def cancel_midway(jid: int, new: JobState, **kw: object) -> object:
        job = real(jid, new, **kw)  # type: ignore[arg-type]
        if new is JobState.RESTARTING:  # the user's cancel arrives right now
            sched.store.jobs.request_cancel(jid)
        return job

    monkeypatch.setattr(sched.store.jobs, "transition", cancel_midway)
    ex.end(job_id, 1)
    sched.tick()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.CANCELED
    assert [e.to_state for e in sched.store.jobs.events(job_id)][-2:] == ["RESTARTING", "CANCELED"]


def restarted(sched: SchedulerLoop) -> tuple[SchedulerLoop, FakeExecutor]:
    """A new server on the same store and home, as after the old one was killed."""
    executor = FakeExecutor()
    new = SchedulerLoop(sched.store, sched.blobs, executor, home=sched.home, server_url="http://x")
    return new, executor


def test_a_restarted_server_re_adopts_a_live_attempt(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    sched, _ = loop
    job_id = submit(sched)
    sched.tick()
    new, ex = restarted(sched)
    ex.alive_pids.add(1)  # the launcher outlived the old server
    new.reconcile()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.RUNNING and job.attempts == 1
    assert "kept running" in (sched.store.jobs.events(job_id)[-1].reason or "")
    new.tick()  # the sweep does not take it for lost
    assert sched.store.jobs.get(job_id).state is JobState.RUNNING
    ex.end(job_id, 0)
    new.tick()
    assert sched.store.jobs.get(job_id).state is JobState.COMPLETED
    assert [a.result for a in sched.store.jobs.attempts(job_id)] == ["completed"]


def test_an_attempt_gone_with_the_server_restarts_as_an_infrastructure_failure(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    sched, _ = loop
    job_id = submit(sched, max_restarts=0)
    sched.tick()
    new, _ = restarted(sched)
    new.reconcile()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.QUEUED
    assert (job.restarts, job.infra_restarts) == (0, 1)
    attempt = sched.store.jobs.attempts(job_id)[0]
    assert (attempt.result, attempt.failure) == ("lost", "infra")


def test_killed_ranks_are_counted_apart_from_failures_of_the_code(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    sched, ex = loop
    job_id = submit(sched, max_restarts=1)
    for _ in range(3):  # SIGKILLed three times: max_restarts=1 is not used up
        sched.tick()
        ex.end(job_id, -9)
        sched.tick()
        assert sched.store.jobs.get(job_id).state in (JobState.QUEUED, JobState.RUNNING)
    job = sched.store.jobs.get(job_id)
    assert (job.restarts, job.infra_restarts) == (0, 3)
    assert {a.failure for a in sched.store.jobs.attempts(job_id) if a.ended_at} == {"infra"}
    sched.tick()
    ex.end(job_id, 1)  # the code's own failure: restart 1 of 1
    sched.tick()
    assert sched.store.jobs.get(job_id).restarts == 1
    sched.tick()
    ex.end(job_id, 1)
    sched.tick()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.FAILED
    assert "max_restarts (1) used up" in (job.reason or "")
    assert [a.failure for a in sched.store.jobs.attempts(job_id)][-2:] == ["user", "user"]


def test_infrastructure_restarts_are_bounded(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    sched, ex = loop
    sched.config = SchedulerConfig(max_infra_restarts=1)
    job_id = submit(sched, max_restarts=5)
    for _ in range(2):
        sched.tick()
        ex.end(job_id, -9)
        sched.tick()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.FAILED
    assert "max_infra_restarts" in (job.reason or "")


@pytest.mark.parametrize(
    ("code", "log_line", "why"),
    [
        (1, "ModuleNotFoundError: No module named 'tranformers'", "ModuleNotFoundError"),
        (1, "OSError: [Errno 28] No space left on device", "No space left on device"),
        (2, "usage: train.py [-h] --lr LR", "exit code 2"),
    ],
)
def test_failures_that_cannot_fix_themselves_are_not_restarted(
    loop: tuple[SchedulerLoop, FakeExecutor], code: int, log_line: str, why: str
) -> None:
    sched, ex = loop
    job_id = submit(sched, max_restarts=3)
    sched.tick()
    logs = JobLayout(sched.home, job_id).logs
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "rank-0.log").write_text(
        "=== trainhouse: attempt 1, rank 0, 2026-11-30 ===\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n'
        f"{log_line}\n"
    )
    ex.end(job_id, code)
    sched.tick()
    job = sched.store.jobs.get(job_id)
    assert job.state is JobState.FAILED and job.restarts == 0
    assert why in (job.reason or "") and "not restarted" in (job.reason or "")
    attempt = sched.store.jobs.attempts(job_id)[0]
    assert attempt.failed_rank == 0 and attempt.failure == "user"
    assert log_line in (attempt.log_tail or "")


def test_the_patterns_only_look_at_the_failed_attempt(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    """An error an earlier attempt logged does not stop the restart of a later one."""
    sched, ex = loop
    job_id = submit(sched, max_restarts=3)
    sched.tick()
    logs = JobLayout(sched.home, job_id).logs
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "rank-0.log").write_text(
        "=== trainhouse: attempt 1, rank 0, x ===\nImportError: once, long ago\n"
        "=== trainhouse: attempt 2, rank 0, x ===\nRuntimeError: flaky network\n"
    )
    ex.end(job_id, 1)  # attempt 1's own failure reads as permanent ...
    sched.tick()
    assert sched.store.jobs.get(job_id).state is JobState.FAILED
    job2 = submit(sched, max_restarts=3)
    sched.tick()
    sched.store.jobs.update(job2, attempts=2)
    logs2 = JobLayout(sched.home, job2).logs
    logs2.mkdir(parents=True, exist_ok=True)
    (logs2 / "rank-0.log").write_text((logs / "rank-0.log").read_text())
    ex.exits.append(Exit(job2, 2, 1, {"0": 1}))
    sched.tick()  # ... attempt 2's is not
    assert sched.store.jobs.get(job2).state in (JobState.QUEUED, JobState.RUNNING)


def test_a_sigkilled_rank_is_the_cause_even_when_a_peer_was_recorded_first(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    """Regression: on a busy machine rank 0's gloo error (exit 1) was recorded before the
    SIGKILLed rank 1's record, so a killed rank counted as a failure of the job's code and a
    job with max_restarts: 0 failed instead of restarting."""
    sched, ex = loop
    job_id = submit(sched, max_restarts=0)
    sched.tick()
    ex.exits.append(Exit(job_id, 1, 1, {"0": 1, "1": -9}, None, {"0": 10.0, "1": 10.2}))
    sched.tick()
    job = sched.store.jobs.get(job_id)
    assert job.state in (JobState.QUEUED, JobState.RUNNING), job.reason
    attempt = sched.store.jobs.attempts(job_id)[0]
    assert (attempt.failure, attempt.failed_rank) == ("infra", 1)
    assert "rank 1 was killed by signal 9" in (attempt.reason or "")


def submit_gpu_job(sched: SchedulerLoop, owner: str = "ann") -> int:
    spec = {
        "entrypoint": "python train.py",
        "resources": {"nodes": 1, "procs_per_node": 1, "gpus_per_node": 1, "cpus_per_proc": 1},
    }
    return sched.store.jobs.create(
        name="g", owner=owner, priority="normal", spec=spec, archive_sha256=sched.digest
    ).id  # type: ignore[attr-defined]


def test_the_loop_decides_as_decide_would_and_keeps_its_queue_between_ticks(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    sched, ex = loop  # one node, 4 CPU cores, no GPUs: GPU jobs wait
    ids = [submit_gpu_job(sched, owner) for owner in ("ann", "bob", "ann")]
    cpu = submit(sched)
    sched.tick()
    assert ex.running() == {cpu}
    assert set(sched.scheduler.index.jobs) == set(ids)
    snap, _ = sched.snapshot()
    assert sched.scheduler.decide(snap) == decide(snap)
    assert set(sched.waiting) == set(ids)
    # a parsed spec is kept between snapshots; a change makes a new entry
    first = {j.id: j for j in snap.queued}
    sched.store.jobs.set_priority(ids[1], "high")
    again, _ = sched.snapshot()
    by_id = {j.id: j for j in again.queued}
    assert by_id[ids[0]] is first[ids[0]] and by_id[ids[2]] is first[ids[2]]
    assert by_id[ids[1]].priority == "high"
    sched.tick()
    assert sched.scheduler.index.jobs[ids[1]].priority == "high"
    assert sched.waiting[ids[1]].startswith("queue position 1:")
    # canceled in the queue: ended by the next tick, gone from the index
    sched.store.jobs.update(ids[0], cancel_requested=True)
    sched.tick()
    assert sched.store.jobs.get(ids[0]).state is JobState.CANCELED
    assert set(sched.scheduler.index.jobs) == {ids[1], ids[2]}


def test_held_gpus_are_named_only_in_the_reasons_of_jobs_that_want_gpus() -> None:
    held = Node("a", 4, 1 << 30, (), held=("GPU 0 is held by pid 7 of an ended attempt",))
    snap = Snapshot(
        (held,),
        (),
        (
            QueuedJob(1, "normal", 1.0, Demand(1, 1, 1)),
            QueuedJob(2, "normal", 2.0, Demand(1, 8, 0)),
        ),
    )
    out = with_held_gpus({1: "needs a GPU", 2: "needs 8 CPU cores"}, snap)
    assert out == {
        1: "needs a GPU; GPU 0 is held by pid 7 of an ended attempt",
        2: "needs 8 CPU cores",
    }


class _Notifying(FakeExecutor):
    """A fake executor that, like the local one, can tell when an attempt ends."""

    def __init__(self) -> None:
        super().__init__()
        self.callback: Callable[[], object] | None = None

    def notify_exits(self, callback: Callable[[], object]) -> None:
        self.callback = callback


def test_an_attempt_that_ends_is_recorded_at_once_not_at_the_next_tick(tmp_path: Path) -> None:
    """Regression: the end of an attempt waited for the loop's next poll (0.5 s by default)."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    blobs = BlobStore(tmp_path / "blobs")
    executor = _Notifying()
    sched = SchedulerLoop(store, blobs, executor, home=tmp_path, server_url="http://x", tick=60)
    sched.digest = stored_archive(blobs)  # type: ignore[attr-defined]
    job = submit(sched)
    sched.start()
    try:
        deadline = time.monotonic() + 10
        while job not in executor.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert executor.callback is not None
        executor.end(job, 0)
        executor.callback()
        while store.jobs.get(job).state is not JobState.COMPLETED:
            assert time.monotonic() < deadline, store.jobs.get(job).state
            time.sleep(0.02)
    finally:
        sched.stop()
        store.close()


def test_a_failed_elastic_attempt_is_analysed_at_the_ranks_it_had(
    loop: tuple[SchedulerLoop, FakeExecutor],
) -> None:
    """Regression: the analysis took the spec's most ranks (4), so an elastic attempt of 3
    whose launcher failed after its ranks exited 0 read as "rank 3 vanished" (infra)."""
    sched, ex = loop
    holder = submit(sched)  # holds 1 of the node's 4 CPUs
    spec = {"entrypoint": "python train.py", "resources": {"procs_per_node": "1:4"}}
    job = sched.store.jobs.create(
        name="e", owner="ann", priority="normal", spec=spec, archive_sha256=sched.digest
    ).id  # type: ignore[attr-defined]
    sched.tick()
    assert ex.running() == {holder, job}
    assert [p.procs for p in ex.launches[-1].placements] == [3]  # its largest size that fits
    ex.exits.append(Exit(job, 1, 1, {"0": 0, "1": 0, "2": 0}))
    sched.tick()
    attempt = sched.store.jobs.attempt(job, 1)
    assert "vanished" not in (attempt.reason or ""), attempt.reason
    assert attempt.failure == "user" and "the launcher" in (attempt.reason or "")
