"""A job's metric series: at most ``MAX_SERIES`` (name, rank) pairs, counted across batches in
the transaction that stores them; and the job row's ``latest_metrics``, the latest value of
every one of the job's own series.

Batches of 50,000 new names each once grew one job's ``latest_metrics`` until an admin's
``GET /jobs`` returned 51 MB in 8 s; and ``val_loss``, logged every few steps, vanished from
``latest_metrics`` as soon as ``loss`` was logged at a later step.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.support.records import new_job, old_store
from trainhouse.core.reports import MAX_SERIES, Columns, check_columns
from trainhouse.core.tokens import hash_token
from trainhouse.errors import InvalidMetrics
from trainhouse.lifecycle import JobState
from trainhouse.store import Store
from trainhouse.store import metrics as ingest


def cols(
    steps: list[int], names: list[str], ranks: list[int | None] | None = None, attempt: int = 1
) -> Columns:
    """Points of ``names`` at ``steps`` (rank None unless ``ranks``), valued 0, 1, 2, ..."""
    n = len(steps)
    values = [float(i) for i in range(n)]
    return check_columns(Columns(steps, names, values, ranks or [None] * n, [1.0] * n, attempt))


def names(count: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}{i:06d}" for i in range(count)]


def series_count(store: Store, job: int) -> int:
    return len(store.metrics.series(job, all_ranks=True))


def test_a_job_has_at_most_max_series_name_rank_pairs(store: Store) -> None:
    job = new_job(store)
    first = names(MAX_SERIES - 3)
    store.metrics.add(job, cols([0] * len(first), first), batch_id="a")
    # one name on two ranks: two series
    store.metrics.add(job, cols([0, 0, 9], ["loss", "loss", "gone"], [0, 1, None]), batch_id="b")
    assert series_count(store, job) == MAX_SERIES
    with pytest.raises(InvalidMetrics) as refused:
        store.metrics.add(job, cols([1, 1], ["loss", "new"], [2, None]), batch_id="c")
    message = str(refused.value)
    assert f"at most {MAX_SERIES} metric series" in message
    assert f"job {job} has {MAX_SERIES}" in message and "2 new" in message
    # nothing of the refused batch stayed, not even its id: a corrected retry is stored
    assert series_count(store, job) == MAX_SERIES
    assert store.metrics.add(job, cols([1, 1], ["loss", first[0]], [1, None]), batch_id="c") == 2
    # a resume drops every point of "gone"; the series still counts, and takes points again
    store.metrics.add(job, cols([1], [first[1]], attempt=2), resume=(2, 0))
    assert series_count(store, job) == MAX_SERIES - 1
    with pytest.raises(InvalidMetrics, match=f"has {MAX_SERIES}"):
        store.metrics.add(job, cols([1], ["other"], attempt=2))
    assert store.metrics.add(job, cols([2], ["gone"], attempt=2)) == 1
    # another job has a count of its own
    assert store.metrics.add(new_job(store), cols([0], ["other"])) == 1


def test_concurrent_reports_cannot_overshoot_the_cap(store: Store) -> None:
    """The second of two reports that each add a series to a job one short of the cap waits
    for the first's transaction, then counts its series too: it is refused."""
    job = new_job(store)
    first = names(MAX_SERIES - 1)
    store.metrics.add(job, cols([0] * len(first), first))
    outcome: list[object] = []

    def second() -> None:
        try:
            outcome.append(store.metrics.add(job, cols([0], ["late"]), batch_id="late"))
        except InvalidMetrics as exc:
            outcome.append(exc)

    with store.transaction() as conn:  # the first report, held open
        ingest.add(conn, store.dialect, job, cols([0], ["early"]), batch_id="early")
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive() and outcome == []  # it waits for the first to commit
    thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidMetrics), outcome
    assert series_count(store, job) == MAX_SERIES


def test_latest_metrics_holds_the_latest_value_of_every_series(store: Store) -> None:
    job = new_job(store)
    store.metrics.add(
        job, cols([0, 0, 1, 2, 2], ["loss", "val_loss", "loss", "loss", "loss"], [None] * 4 + [3])
    )
    got = store.jobs.get(job)
    assert (got.last_step, got.latest_metrics) == (2, {"loss": 3.0, "val_loss": 1.0})
    store.metrics.add(job, cols([3, 4, 4], ["loss", "loss", "loss"]))  # the last of a step wins
    assert store.jobs.get(job).latest_metrics == {"loss": 2.0, "val_loss": 1.0}
    store.metrics.add(job, cols([5, 5], ["val_loss", "lr"]))
    got = store.jobs.get(job)
    assert (got.last_step, got.latest_metrics) == (5, {"loss": 2.0, "val_loss": 0.0, "lr": 1.0})
    # out of order within a batch: the value at the series' highest step
    store.metrics.add(job, cols([7, 6], ["loss", "loss"]))
    assert store.jobs.get(job).latest_metrics["loss"] == 0.0
    # a restart from an earlier checkpoint: progress moves back, the latest values stay
    store.metrics.add(job, cols([1], ["loss"]), resume=(2, 0))
    got = store.jobs.get(job)
    assert (got.last_step, got.latest_metrics) == (1, {"loss": 0.0, "val_loss": 0.0, "lr": 1.0})


def report_of(batch_id: str, series: list[str]) -> bytes:
    n = len(series)
    columns = {"step": [0] * n, "name": series, "value": [1.0] * n, "rank": [None] * n}
    body = {"batch_id": batch_id, "attempt": 1, "columns": {**columns, "wall_time": [1.0] * n}}
    return json.dumps(body).encode()


def test_the_report_route_refuses_a_series_past_the_cap_with_422(api: TestClient) -> None:
    store: Store = api.app.state.runtime.store  # type: ignore[attr-defined]
    job = new_job(store)
    store.jobs.transition(job, JobState.CANCELED, reason="test")
    store.jobs.update(job, token_hash=hash_token("known"))
    url, auth = f"/api/v1/jobs/{job}/report", {"Authorization": "Bearer known"}
    resp = api.post(url, content=report_of("full", names(MAX_SERIES)), headers=auth)
    assert resp.status_code == 200, resp.text
    resp = api.post(url, content=report_of("more", names(3, "x")), headers=auth)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_request"
    assert f"at most {MAX_SERIES} metric series" in error["message"]
    assert f"job {job} has {MAX_SERIES}" in error["message"]
    listed = api.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"]
    assert len(listed[0]["latest_metrics"]) == MAX_SERIES


def test_the_upgrade_records_the_series_already_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = old_store(url, "0006")
    with old.engine.begin() as conn:
        for name, rank, level, bucket in (
            ("loss", -1, 16, 0),
            ("loss", -1, 65536, 0),
            ("loss", -1, 65536, 1),
            ("acc", 3, 65536, 0),
        ):
            conn.execute(
                sa.text(
                    "INSERT INTO metric_buckets (job_id, name, rank, level, bucket, count, "
                    "first_step, last_step) VALUES (1, :name, :rank, :level, :bucket, 1, 0, 0)"
                ),
                {"name": name, "rank": rank, "level": level, "bucket": bucket},
            )
    old.close()
    store = Store(url)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT name, rank FROM metric_series ORDER BY name"))
            assert [tuple(r) for r in rows] == [("acc", 3), ("loss", -1)]
    finally:
        store.close()
