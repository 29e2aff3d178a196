"""store.tracking on SQLite and PostgreSQL: experiments, tracked runs (jobs of kind "tracked",
never scheduled), the MLflow view of a launched job, params and tags; migration 0010."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.records import new_job, old_store
from trainhouse.errors import NotFound
from trainhouse.lifecycle import JobState
from trainhouse.store import Store
from trainhouse.store.tracking import AlreadyExists, ValueChanged, job_name


def test_experiments(store: Store) -> None:
    tracking = store.tracking
    assert tracking.experiment(0).name == "Default"
    assert tracking.experiment_named("Default").id == 0
    made = tracking.create_experiment("mnist")
    assert made.id >= 1 and tracking.experiment_named("mnist") == made
    assert tracking.experiment(made.id) == made
    with pytest.raises(AlreadyExists):
        tracking.create_experiment("mnist")
    with pytest.raises(AlreadyExists):
        tracking.create_experiment("Default")
    assert tracking.experiment_for("mnist") == made
    assert tracking.experiment_for("cifar").name == "cifar"
    with pytest.raises(NotFound):
        tracking.experiment(999)
    with pytest.raises(NotFound):
        tracking.experiment_named("nope")


def test_a_tracked_run_is_a_job_the_scheduler_never_sees(store: Store) -> None:
    launched = new_job(store)
    run = store.tracking.create_tracked(
        owner="ada",
        run_name="my run: v2",
        experiment_id=0,
        start_time=1_700_000_000_000,
        token_hash="h" * 64,
        tags={"mlflow.runName": "my run: v2"},
    )
    assert run.kind == "tracked" and run.tracked and run.state is JobState.RUNNING
    assert run.name == "my-run-v2" and run.owner == "ada" and run.attempts == 1
    # the scheduler's and the services' reads leave it out; the listing asks for both
    assert [j.id for j in store.jobs.list()] == [launched]
    assert [j.id for j in store.jobs.list(states=[JobState.RUNNING])] == []
    assert [j.id for j in store.jobs.list(tracked=None)] == [run.id, launched]
    assert [j.id for j in store.jobs.list(tracked=True)] == [run.id]
    assert store.jobs.count(tracked=None) == 2 and store.jobs.count() == 1
    view = store.tracking.run(run)
    assert (view.status, view.start_time, view.run_name) == (
        "RUNNING",
        1_700_000_000_000,
        "my run: v2",
    )
    store.tracking.update_run(run, status="FINISHED", end_time=1_700_000_005_000)
    ended = store.jobs.get(run.id)
    assert ended.state is JobState.COMPLETED and ended.ended_at is not None
    assert [e.to_state for e in store.jobs.events(run.id)] == [JobState.RUNNING, JobState.COMPLETED]
    assert store.tracking.run(ended).end_time == 1_700_000_005_000
    store.tracking.update_run(ended, status="RUNNING")  # MLflow's view only: the job stays ended
    assert store.jobs.get(run.id).state is JobState.COMPLETED


def test_a_launched_jobs_mlflow_view_and_values(store: Store) -> None:
    job = store.jobs.get(new_job(store, name="digits"))
    view = store.tracking.run(job)
    assert (view.experiment_id, view.run_name, view.status) == (0, "digits", "RUNNING")
    exp = store.tracking.create_experiment("e")
    store.tracking.update_run(job, status="FINISHED", run_name="r", experiment_id=exp.id)
    assert store.jobs.get(job.id).state is JobState.QUEUED  # the job's state is the scheduler's
    assert store.tracking.run(job).experiment_id == exp.id
    store.tracking.put(job.id, "param", {"lr": "0.1", "bs": "32"})
    store.tracking.put(job.id, "param", {"lr": "0.1"})  # the same value again: fine
    with pytest.raises(ValueChanged, match="keeps its first value"):
        store.tracking.put(job.id, "param", {"bs": "64", "new": "1"})
    assert store.tracking.values(job.id, "param") == {"bs": "32", "lr": "0.1"}  # nothing stored
    store.tracking.put(job.id, "tag", {"team": "a\x00b"})
    store.tracking.put(job.id, "tag", {"team": "vision"})  # a tag is replaced
    assert store.tracking.values(job.id, "tag") == {"team": "vision"}


def test_job_names_from_run_names() -> None:
    assert job_name("laptop run #1") == "laptop-run-1"
    assert job_name("  ") == "run-"
    assert job_name("_x") == "x"
    assert job_name("é") == "run-é"
    assert len(job_name("x" * 300)) == 128


def test_migration_0010_keeps_jobs_launched(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for url in (f"sqlite:///{tmp_path / 'old.db'}", request.getfixturevalue("pg_url")):
        old_store(url, "0008").close()
        store = Store(url, migrate=True)
        try:
            (job,) = store.jobs.list(tracked=None)
            assert job.kind == "launched" and not job.tracked
            with store.engine.connect() as conn:
                tables = set(sa.inspect(conn).get_table_names())
            assert {"mlflow_experiments", "mlflow_runs", "run_values"} <= tables
        finally:
            store.close()
