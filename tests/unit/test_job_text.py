"""Text a job controls (its log lines, its reports): stored whatever bytes it holds, and shown
only to those who may read the job.

PostgreSQL's text type holds no NUL character, and no backend encodes a lone surrogate as
UTF-8: a failing rank that printed either once made its attempt unrecordable, so the job was
taken for lost and restarted again and again, its exit code and ``no_restart_on`` ignored.
A failed job's reason quotes its failing rank's last lines: with ``--job-visibility list`` the
other users' rows in the job list and the queue carried it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fastapi.testclient import TestClient

from tests.support.api import services, submit, wait_state, workdir
from tests.support.fakes import FakeExecutor
from tests.support.records import new_job, stored_archive
from tests.support.team import make_team
from trainhouse.jobfs.layout import JobLayout
from trainhouse.lifecycle import JobState
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.store import BlobStore, Store
from trainhouse.store.tables import storable

HOSTILE = "before\x00after \ud800 end"


def test_storable_replaces_nul_and_lone_surrogates_and_nothing_else() -> None:
    assert storable(HOSTILE) == "before\ufffdafter \ufffd end"
    kept = "\x1b[31mred\x1b[0m tab\tnewline\n ünïcödé ✓ 😀 \ufffd"
    assert storable(kept) == kept
    assert storable("") == ""
    assert storable("\x00" * 3) == "\ufffd" * 3
    for text in (storable(HOSTILE), storable("\udc80\ud83d")):
        text.encode()  # UTF-8 takes it


def test_every_job_controlled_text_column_stores_nul_and_surrogates(store: Store) -> None:
    job_id = new_job(store)
    store.jobs.start_attempt(job_id, placement=[], token_hash="0" * 64)
    store.jobs.update_attempt(job_id, 1, reason=HOSTILE, log_tail=HOSTILE)
    store.jobs.update(job_id, reason=HOSTILE)
    store.jobs.add_event(job_id, HOSTILE)
    store.jobs.transition(job_id, JobState.FAILED, reason=HOSTILE)
    ckpt = store.checkpoints.add(
        job_id, attempt=1, step=1, path="step-1.pt", size=1, sha256="0" * 64
    )
    store.checkpoints.mark_corrupt(ckpt.id, HOSTILE)
    shown = storable(HOSTILE)
    attempt = store.jobs.attempt(job_id, 1)
    assert (attempt.reason, attempt.log_tail) == (shown, shown)
    assert store.jobs.get(job_id).reason == shown
    assert [e.reason for e in store.jobs.events(job_id)][-2:] == [shown, shown]
    assert store.checkpoints.get(job_id, ckpt.id).corrupt == shown


def test_a_failing_rank_whose_log_holds_nul_bytes_fails_as_its_exit_code_says(
    store: Store, tmp_path: Path
) -> None:
    """On both backends the attempt is recorded as the code's failure, with its log tail, and
    ``no_restart_on.exit_codes`` ends the job at once (it was "lost" and restarted on
    PostgreSQL)."""
    blobs = BlobStore(tmp_path / "blobs")
    digest = stored_archive(blobs)
    executor = FakeExecutor()
    sched = SchedulerLoop(store, blobs, executor, home=tmp_path, server_url="http://x")
    spec = {
        "entrypoint": "python train.py",
        "max_restarts": 5,
        "no_restart_on": {"exit_codes": [3]},
        "resources": {"procs_per_node": 1},
    }
    job_id = new_job(store, spec=spec, archive_sha256=digest)
    sched.tick()
    assert executor.running() == {job_id}
    log = JobLayout(tmp_path, job_id).log(0)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"=== trainhouse: attempt 1\nstep 1\nbinary \x00\x00 garbage\xff\nboom\n")
    executor.end(job_id, 3)
    sched.tick()
    sched.tick()  # (a failed record was swept up here as a lost attempt)
    job = store.jobs.get(job_id)
    assert job.state is JobState.FAILED, job.reason
    assert (job.exit_code, job.attempts, job.restarts, job.infra_restarts) == (3, 1, 0, 0)
    assert "not restarted: exit code 3 is in no_restart_on.exit_codes" in (job.reason or "")
    assert "binary \ufffd\ufffd garbage\ufffd" in (job.reason or "")
    attempt = store.jobs.attempt(job_id, 1)
    assert (attempt.result, attempt.failure, attempt.exit_code) == ("failed", "user", 3)
    assert attempt.log_tail == "step 1\nbinary \ufffd\ufffd garbage\ufffd\nboom"


def test_a_checkpoint_file_name_that_is_not_utf8_is_skipped_not_fatal(
    api: TestClient, tmp_path: Path
) -> None:
    """A name the file system gives undecoded (a lone surrogate) cannot be stored: registering
    what an attempt left unregistered skips it, and registers the others (it raised, and every
    checkpoint after it stayed unregistered)."""
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    rt = services(api)
    directory = os.fsencode(rt.checkpoints.location(job["id"]))
    os.makedirs(directory, exist_ok=True)
    for step, name in ((1, b"step-1.pt"), (2, b"step-\xff.pt"), (3, b"step-3.pt")):
        data = b"x" * step
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(data)
        record = {
            "attempt": 1,
            "step": step,
            "path": os.fsdecode(name),
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        with open(os.path.join(directory, name + b".json"), "w") as fh:
            fh.write(json.dumps(record))
    added = rt.checkpoints.register_unlisted(job["id"], 1)
    assert sorted(c.path for c in added) == ["step-1.pt", "step-3.pt"]


def test_a_shared_list_and_queue_show_no_text_of_others_jobs(tmp_path: Path) -> None:
    """With ``--job-visibility list``, bob sees alice's jobs by state alone; alice and the
    admin see her reasons."""
    secret = "attempt 1 failed: rank 0 exited with code 1; last lines:\nAPI_KEY=hunter2"
    for team in make_team(tmp_path, job_visibility="list"):
        store = team.rt.store
        failed, yielding, queued = (
            team.submit("alice", name).json()["id"] for name in ("failed", "yielding", "queued")
        )
        executor = team.rt.scheduler.executor
        for job_id in (failed, yielding):
            executor.live[job_id] = 1  # type: ignore[attr-defined]  # "runs": not swept up
            store.jobs.start_attempt(job_id, placement=[], token_hash="0" * 64)
        store.jobs.transition(failed, JobState.FAILED, reason=secret, exit_code=1)
        executor.live.pop(failed)  # type: ignore[attr-defined]
        store.jobs.update(yielding, preempt_requested=True, reason=secret)
        store.jobs.update(queued, reason=secret)
        for user in ("bob", "vera"):
            listed = team.get(user, "/jobs", params={"all": "true"})
            assert "hunter2" not in listed.text
            rows = {j["id"]: j for j in listed.json()["jobs"]}
            assert set(rows) == {failed, yielding, queued}
            assert rows[failed]["reason"] == "failed with exit code 1"
            assert rows[yielding]["reason"] == "running attempt 1; asked to yield its resources"
            assert rows[queued]["reason"]  # the scheduler's own words, or "queued"
            queue = team.get(user, "/queue")
            assert "hunter2" not in queue.text
            assert [p["id"] for p in queue.json()["preempting"]] == [yielding]
        for user in ("alice", "root"):
            rows = {
                j["id"]: j for j in team.get(user, "/jobs", params={"all": "true"}).json()["jobs"]
            }
            assert rows[failed]["reason"] == secret
            assert team.get(user, "/queue").json()["preempting"][0]["reason"] == secret
