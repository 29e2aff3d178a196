"""The datasets' store on both backends: numbers per name never reused, identical content
giving its version, a job's pins resolved in its own transaction (a bare name the newest), and
a version a job that has not ended pins kept from removal."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainhouse.core.datasets import Pin
from trainhouse.core.errors import NotFound, StoreError
from trainhouse.core.lifecycle import JobState
from trainhouse.core.spec import JobSpec
from trainhouse.store import Store


def _add(store: Store, name: str, digest: str, source: str | None = None) -> tuple[int, bool]:
    made, new = store.datasets.add_version(
        name,
        owner="ana",
        digest=digest,
        source=source,
        storage_options={},
        files=1,
        size=10,
        checksums="sha256",
        description=None,
    )
    return made.version, new


def _job(store: Store, datasets: dict[str, str]) -> int:
    spec = JobSpec(entrypoint="python train.py", datasets=datasets)
    job = store.jobs.create(
        name="j", owner="ana", priority="normal", spec=spec, archive_sha256="0" * 64
    )
    return job.id


def test_numbers_are_per_name_and_never_reused(store: Store) -> None:
    assert _add(store, "a", "1" * 64) == (1, True)
    assert _add(store, "a", "1" * 64) == (1, False)  # the same content: its version
    assert _add(store, "a", "1" * 64, source="s3://b/p") == (2, True)  # read elsewhere
    assert _add(store, "a", "2" * 64) == (3, True)
    assert _add(store, "b", "2" * 64) == (1, True)
    store.datasets.remove_version("a", 3)
    assert _add(store, "a", "3" * 64) == (4, True)
    assert [(d.name, d.versions, d.latest) for d in store.datasets.list()] == [
        ("a", 3, 4),
        ("b", 1, 1),
    ]
    with pytest.raises(NotFound, match="no version 3"):
        store.datasets.version("a", 3)


def test_a_jobs_pins_resolve_at_insert_and_keep_their_version(store: Store) -> None:
    _add(store, "a", "1" * 64)
    _add(store, "a", "2" * 64)
    job = _job(store, {"train": "a", "val": "a@1"})
    assert store.datasets.pins(job) == [
        Pin("train", "a", 2, "2" * 64),
        Pin("val", "a", 1, "1" * 64),
    ]
    assert store.jobs.get(job).spec.datasets == {"train": "a@2", "val": "a@1"}
    staged = store.datasets.stage_request(job)
    assert staged is not None and [s.pin.ref for s in staged.sources] == ["a@2", "a@1"]
    with pytest.raises(NotFound, match=r"datasets\.x: no dataset named 'nope'"):
        _job(store, {"x": "nope"})
    with pytest.raises(NotFound, match="has no version 9"):
        _job(store, {"x": "a@9"})
    assert store.datasets.users("a", 1) == [job]


def test_a_version_a_live_job_pins_is_not_removed(store: Store) -> None:
    _add(store, "a", "1" * 64)
    job = _job(store, {"train": "a@1"})
    with pytest.raises(StoreError, match=f"pinned by job {job} \\(QUEUED\\)"):
        store.datasets.remove_version("a", 1)
    store.jobs.transition(job, JobState.CANCELED, reason="test")
    assert store.datasets.remove_version("a", 1).version == 1
    # the job keeps what it read; staging it again names the removed version
    assert store.datasets.pins(job) == [Pin("train", "a", 1, "1" * 64)]
    with pytest.raises(NotFound, match=r"a@1 was removed after the job pinned it"):
        store.datasets.stage_request(job)


def test_the_runs_table_filters_and_shows_a_jobs_pinned_versions(store: Store) -> None:
    from trainhouse.core.errors import InvalidQuery
    from trainhouse.core.runquery import parse, parse_field

    _add(store, "digits", "1" * 64)
    _add(store, "digits", "2" * 64)
    _add(store, "other", "3" * 64)
    old = _job(store, {"train": "digits@1"})
    new = _job(store, {"train": "digits", "val": "other"})
    plain = _job(store, {})

    def ids(where: str) -> list[int]:
        page = store.runs.page(where=parse(where), order="asc")
        return [j.id for j in page.jobs]

    assert ids('datasets.train = "digits@2"') == [new]
    assert ids("datasets.train = digits") == [old, new]
    assert ids('datasets.train != "digits@2"') == [old, plain]
    assert ids("datasets.val ~ other") == [new]
    assert ids('datasets.train in ("digits@1", "digits@2")') == [old, new]
    page = store.runs.page(columns=[parse_field("datasets.train")], order="asc")
    assert [page.values[j.id].get("datasets.train") for j in page.jobs] == [
        "digits@1",
        "digits@2",
        None,
    ]
    with pytest.raises(InvalidQuery, match="compares with"):
        ids("datasets.train > 3")
    with pytest.raises(InvalidQuery, match="not a sort key"):
        store.runs.page(sort=parse_field("datasets.train"))


def test_a_model_a_job_saved_carries_the_versions_it_was_trained_on(store: Store) -> None:
    _add(store, "digits", "1" * 64)
    job = _job(store, {"train": "digits"})
    made = store.models.add_version(
        "cnn",
        owner="ana",
        job_id=job,
        attempt=1,
        step=5,
        path="models/cnn/step-000000005",
        kind="export",
        files=[{"name": "program.pt2", "size": 10, "sha256": "a" * 64}],
    )
    trained_on = [{"key": "train", "name": "digits", "version": 1, "digest": "1" * 64}]
    assert made.record["datasets"] == trained_on
    # kept when the job is gone: the model stays traced to the bytes
    store.jobs.transition(job, JobState.CANCELED, reason="test")
    assert store.runs.delete(job)["job_datasets"] == 1
    assert store.models.version("cnn", 1).record["datasets"] == trained_on


def test_a_searchs_trials_all_read_the_version_pinned_at_its_submit(
    store: Store, tmp_path: Path
) -> None:
    from trainhouse.spec import parse_spec
    from trainhouse.tune.runner import SearchRunner

    _add(store, "a", "1" * 64)
    spec = parse_spec(
        "name: s\nentrypoint: python train.py\ndatasets: {train: a}\n"
        "hparams: {lr: {log_uniform: [1.0e-4, 1.0e-1]}}\n"
        "search: {method: random, metric: loss, max_trials: 2, max_concurrent: 2, seed: 1}\n"
    )
    search = store.searches.create(owner="ana", spec=spec, archive_sha256="0" * 64)
    assert search.spec_data["datasets"] == {"train": "a@1"}
    _add(store, "a", "2" * 64)  # new data while the search runs: its trials keep a@1
    SearchRunner(store, db_url=store.url, home=tmp_path, wake_scheduler=lambda: None).tick()
    trials = [j for j in store.jobs.list() if j.search_id == search.id]
    assert len(trials) == 2
    assert all(store.datasets.pins(j.id) == [Pin("train", "a", 1, "1" * 64)] for j in trials)
