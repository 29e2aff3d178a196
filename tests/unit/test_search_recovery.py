"""The two stores of a search after a server died between their writes (both backends): an
Optuna trial asked but never given a job is adopted, not asked again; a trial Optuna was told
of but whose row was not ended is ended without telling twice; nothing is duplicated."""

from __future__ import annotations

from pathlib import Path

import optuna

from trainhouse.core.reports import Columns
from trainhouse.lifecycle import JobState
from trainhouse.spec import parse_spec
from trainhouse.store import MetricPoint, Store
from trainhouse.tune.runner import SearchRunner

SPEC = """
name: r
entrypoint: python train.py
hparams: {lr: {log_uniform: [1.0e-4, 1.0e-1]}, opt: {choice: [a, b]}}
search: {method: random, metric: val_loss, max_trials: 3, max_concurrent: 2, seed: 7}
"""


def service(store: Store, home: Path) -> SearchRunner:
    return SearchRunner(store, db_url=store.url, home=home, wake_scheduler=lambda: None)


def complete(store: Store, job_id: int, value: float) -> None:
    store.jobs.update(job_id, latest_metrics={"val_loss": value})
    if store.jobs.get(job_id).state is JobState.QUEUED:
        store.jobs.transition(job_id, JobState.RUNNING)
    store.jobs.transition(job_id, JobState.COMPLETED, reason="every rank exited 0")


def test_a_dead_servers_half_written_trials_are_mended(store: Store, tmp_path: Path) -> None:
    search = store.searches.create(owner="o", spec=parse_spec(SPEC), archive_sha256="0" * 64)
    old = service(store, tmp_path)
    study = old.opened(search).study
    # the old server asked Optuna for trial 0 and died before sampling opt or writing its job
    asked = study.ask()
    asked.suggest_float("lr", 1.0e-4, 1.0e-1, log=True)
    lr = asked.params["lr"]
    # a new server (a new service, its own storage) takes over
    new = service(store, tmp_path)
    new.advance(search)
    trials = store.searches.trials(search.id)
    assert [t.number for t in trials] == [0, 1]  # adopted, then one more asked: max_concurrent
    assert trials[0].params["lr"] == lr and trials[0].params["opt"] in ("a", "b")
    jobs = store.jobs.get_many(t.job_id for t in trials)
    assert jobs[trials[0].job_id].spec.hparams == trials[0].params
    new.advance(search)  # nothing to do twice
    assert len(store.searches.trials(search.id)) == 2
    assert len(study.get_trials()) == 2
    # trial 0 ends; Optuna is told, and the server dies before the row says so
    complete(store, trials[0].job_id, 0.5)
    study.tell(0, 0.5)
    new.advance(search)
    trials = store.searches.trials(search.id)
    assert trials[0].state == "COMPLETED" and trials[0].value == 0.5
    assert [t.number for t in trials] == [0, 1, 2]
    # trial 1's steps reached the store without the report route (spooled while the server was
    # down, ingested as its attempt ended): Optuna's history gets them before it is told
    new.on_report(store.jobs.get(trials[1].job_id), Columns([0], ["val_loss"], [4.0], [None], [0]))
    store.jobs.transition(trials[1].job_id, JobState.RUNNING)
    store.metrics.add(
        trials[1].job_id,
        [MetricPoint(step, "val_loss", 3.0 - step) for step in range(3)],
        batch_id="spooled",
    )
    for trial in trials[1:]:
        complete(store, trial.job_id, 1.0 + trial.number)
    new.advance(search)
    new.advance(search)
    assert store.searches.get(search.id).state == "COMPLETED"
    frozen = study.get_trials()
    assert [t.state for t in frozen] == [optuna.trial.TrialState.COMPLETE] * 3
    assert [t.value for t in frozen] == [0.5, 2.0, 3.0]
    assert frozen[1].intermediate_values == {0: 3.0, 1: 2.0, 2: 1.0}
    assert "best: trial 0" in (store.searches.get(search.id).reason or "")


def test_a_trials_end_optuna_lost_is_told_again_from_its_row(store: Store, tmp_path: Path) -> None:
    """Optuna's file is synced NORMAL: a power loss can take back its record of how a trial
    ended, while the row (synced FULL) kept it. The next server tells Optuna again from the
    row, so the trial does not stay RUNNING in the study for good."""
    from sqlalchemy import text

    from trainhouse.tune import study as studies

    search = store.searches.create(owner="o", spec=parse_spec(SPEC), archive_sha256="0" * 64)
    old = service(store, tmp_path)
    old.advance(search)
    first = store.searches.trials(search.id)[0]
    store.metrics.add(first.job_id, [MetricPoint(s, "val_loss", 2.0 - s) for s in range(2)])
    complete(store, first.job_id, 0.25)
    old.advance(search)
    assert store.searches.trials(search.id)[0].state == "COMPLETED"
    # the power loss: Optuna's tables lose the trial's end (its state, value, history)
    url, options = studies.storage_location(store.url, tmp_path)
    rdb = optuna.storages.RDBStorage(url, engine_kwargs=options)
    with rdb.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE trials SET state = 'RUNNING', datetime_complete = NULL WHERE trial_id = :t"
            ),
            {"t": first.trial_id},
        )
        for table in ("trial_values", "trial_intermediate_values"):
            conn.execute(text(f"DELETE FROM {table} WHERE trial_id = :t"), {"t": first.trial_id})
    rdb.engine.dispose()

    new = service(store, tmp_path)
    new.advance(search)
    frozen = new.opened(search).study.get_trials()[0]
    assert frozen.state is optuna.trial.TrialState.COMPLETE and frozen.value == 0.25
    assert frozen.intermediate_values == {0: 2.0, 1: 1.0}
