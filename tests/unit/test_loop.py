"""The scheduler loop against a fake executor: no job is ever stranded in RUNNING."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from trainhouse.executors.base import Exit, Launch, ProcessInfo
from trainhouse.scheduler.lifecycle import JobState
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.scheduler.resources import Node
from trainhouse.store import BlobStore, Store


class FakeExecutor:
    def __init__(self) -> None:
        self.live: dict[int, int] = {}  # job id -> attempt
        self.exits: list[Exit] = []

    def nodes(self) -> list[Node]:
        return [Node("fake", 4, 1 << 30)]

    def launch(self, launch: Launch) -> ProcessInfo:
        self.live[launch.job_id] = launch.attempt
        return ProcessInfo(pid=1, create_time=0.0)

    def poll(self) -> list[Exit]:
        out, self.exits = self.exits, []
        for e in out:
            self.live.pop(e.job_id, None)
        return out

    def stop(self, job_id: int, *, grace: float, reason: str, terminate: bool = True) -> None:
        pass

    def running(self) -> set[int]:
        return set(self.live)

    def kill_orphans(self, job_id: int, attempt: int) -> int:
        return 0

    def shutdown(self, *, grace: float) -> list[Exit]:
        return []

    def end(self, job_id: int, code: int) -> None:
        self.exits.append(Exit(job_id, self.live[job_id], code, {"0": code}))


@pytest.fixture
def loop(tmp_path: Path) -> tuple[SchedulerLoop, FakeExecutor]:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    blobs = BlobStore(tmp_path / "blobs")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    digest, _ = blobs.put(buf, 1 << 20)
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
    return sched.store.create_job(
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
    real = sched.store.update_attempt
    calls = {"n": 0}

    def flaky(job_id: int, number: int, **fields: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database is locked")
        real(job_id, number, **fields)

    monkeypatch.setattr(sched.store, "update_attempt", flaky)
    ex.end(a, 0)
    ex.end(b, 0)
    sched.tick()  # a's record fails; b's is still recorded
    states = {j: sched.store.get_job(j).state for j in (a, b)}
    assert JobState.COMPLETED in states.values()
    stranded = next(j for j, s in states.items() if s is not JobState.COMPLETED)
    sched.tick()  # the sweep finds the RUNNING job without a process and requeues it
    job = sched.store.get_job(stranded)
    assert job.state in (JobState.QUEUED, JobState.RUNNING)
    assert job.attempts == 2 or sched.store.attempts(stranded)[0].result == "lost"


def test_cancel_during_a_restart_ends_the_job(
    loop: tuple[SchedulerLoop, FakeExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a cancel that landed between RESTARTING and QUEUED was lost."""
    sched, ex = loop
    job_id = submit(sched, max_restarts=3)
    sched.tick()
    real = sched.store.transition

    def cancel_midway(jid: int, new: JobState, **kw: object) -> object:
        job = real(jid, new, **kw)  # type: ignore[arg-type]
        if new is JobState.RESTARTING:  # the user's cancel arrives right now
            sched.store.request_cancel(jid)
        return job

    monkeypatch.setattr(sched.store, "transition", cancel_midway)
    ex.end(job_id, 1)
    sched.tick()
    job = sched.store.get_job(job_id)
    assert job.state is JobState.CANCELED
    assert [e.to_state for e in sched.store.events(job_id)][-2:] == ["RESTARTING", "CANCELED"]
