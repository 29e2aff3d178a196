"""Log retention deletes the logs of jobs ended long enough ago, and only those."""

from __future__ import annotations

from pathlib import Path

from tests.support.records import new_job
from trainhouse.ingest.logretention import DELETED_NOTE, expire_logs
from trainhouse.jobfs.layout import JobLayout
from trainhouse.lifecycle import JobState
from trainhouse.store import Store


def test_logs_expire_after_the_retention(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        ids = []
        for _ in range(3):
            job_id = new_job(store)
            logs = JobLayout(tmp_path, job_id).logs
            logs.mkdir(parents=True)
            (logs / "rank-0.log").write_text("hello\n")
            ids.append(job_id)
        old, recent, running = ids
        store.jobs.transition(old, JobState.CANCELED, ended_at=1000.0)
        store.jobs.transition(recent, JobState.CANCELED, ended_at=5000.0)
        assert expire_logs(store, tmp_path, retention=2000.0, now=4000.0) == 1
        assert not JobLayout(tmp_path, old).logs.exists()
        assert JobLayout(tmp_path, recent).logs.is_dir()
        assert JobLayout(tmp_path, running).logs.is_dir()  # never the logs of a live job
        assert DELETED_NOTE in (store.jobs.events(old)[-1].reason or "")
        assert expire_logs(store, tmp_path, retention=2000.0, now=4000.0) == 0  # once
    finally:
        store.close()
