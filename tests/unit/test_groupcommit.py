"""Group commit of metric reports (trainhouse.ingest.groupcommit) on SQLite and PostgreSQL:
many reports in one transaction, errors per report, each batch id once, a bounded queue, a
drain at stop; and the report route's 503 when the queue is full."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from tests.support.api import app_client, error_of, services, submit, wait_launched, workdir
from tests.support.records import new_job
from trainhouse.core.reports import MAX_SERIES, Columns, Report, check_columns
from trainhouse.core.tokens import hash_token
from trainhouse.errors import InvalidMetrics, NotFound, ServerBusy
from trainhouse.ingest import groupcommit as gc
from trainhouse.store import Store

TOKEN = "thj_test-credential"


def report(
    first: int,
    count: int = 10,
    *,
    names: list[str] | None = None,
    value: float = 0.0,
    batch_id: str | None = None,
) -> Report:
    """``count`` steps from ``first`` of each of ``names`` (``loss``), valued step + value."""
    names = names or ["loss"]
    steps = [s for s in range(first, first + count) for _ in names]
    named = [n for _ in range(first, first + count) for n in names]
    values = [s + value for s in steps]
    n = len(steps)
    columns = check_columns(Columns(steps, named, values, [None] * n, [1.0] * n, 1))
    return Report(batch_id or uuid.uuid4().hex, 1, columns)


def running(store: Store) -> int:
    """A job whose current credential is TOKEN."""
    job = new_job(store)
    store.jobs.update(job, token_hash=hash_token(TOKEN))
    return job


def put(writer: gc.ReportWriter, job: int, r: Report, token: str = TOKEN) -> Future[int]:
    """Submit ``r`` with ``token``; the future gives the points written."""
    out: Future[int] = Future()

    def done(f: Future[gc.Stored]) -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result().accepted)

    writer.submit(job, r, hash_token(token)).add_done_callback(done)
    return out


class Gate:
    """Holds the writer in its next batch until opened (``before_batch``)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.sizes: list[int] = []

    def __call__(self, size: int) -> None:
        self.sizes.append(size)
        self.entered.set()
        assert self.opened.wait(30), "the gate was never opened"


@pytest.fixture
def writer(store: Store) -> Iterator[gc.ReportWriter]:
    w = gc.ReportWriter(store)
    w.start()
    try:
        yield w
    finally:
        w.stop()


def commits(store: Store) -> list[int]:
    """A list that grows by one at each commit on ``store``'s engine."""
    seen: list[int] = []
    event.listen(store.engine, "commit", lambda _conn: seen.append(1))
    return seen


def held(writer: gc.ReportWriter, job: int) -> tuple[Gate, Future[int]]:
    """The writer held in a batch of one report of ``job`` (steps 10000 on)."""
    gate = Gate()
    writer.before_batch = gate
    first = put(writer, job, report(10_000))
    assert gate.entered.wait(10)
    return gate, first


def steps_of(store: Store, job: int, name: str = "loss") -> list[tuple[int, float | None]]:
    return [(p.step, p.value) for p in store.metrics.points(job, name=name)]


def test_concurrent_reports_share_transactions(store: Store, writer: gc.ReportWriter) -> None:
    jobs = [running(store) for _ in range(5)]
    gate, first = held(writer, jobs[0])
    counted = commits(store)
    futures = [put(writer, job, report(10 * k)) for k in range(8) for job in jobs]
    gate.opened.set()
    assert [f.result(30) for f in futures] == [10] * 40
    assert first.result(30) == 10
    # the first report alone, then the 40 that queued meanwhile in one transaction
    assert gate.sizes == [1, 40] and len(counted) == 2 and writer.transactions == 2
    for job in jobs:
        expected = list(range(80)) + (list(range(10_000, 10_010)) if job == jobs[0] else [])
        assert [s for s, _ in steps_of(store, job)] == expected
        assert store.jobs.get(job).last_step == 79  # the last report's, in submission order


def test_a_bad_report_fails_alone(store: Store, writer: gc.ReportWriter) -> None:
    full, other = running(store), running(store)
    many = [f"m{i:05d}" for i in range(MAX_SERIES)]
    n = MAX_SERIES
    store.metrics.add(full, check_columns(Columns([0] * n, many, [1.0] * n, [None] * n, [1.0] * n)))
    gate, _ = held(writer, other)
    counted = commits(store)
    before = put(writer, other, report(0))
    bad = put(writer, full, report(1, names=["one too many"]))
    fine = put(writer, full, report(1, names=[many[0]]))
    after = put(writer, other, report(20))
    gate.opened.set()
    with pytest.raises(InvalidMetrics, match=f"at most {MAX_SERIES} metric series"):
        bad.result(30)
    assert (before.result(30), fine.result(30), after.result(30)) == (10, 10, 10)
    assert [s for s, _ in steps_of(store, other)] == [
        *range(10),
        *range(20, 30),
        *range(10_000, 10_010),
    ]
    assert steps_of(store, full, "one too many") == []
    assert len(steps_of(store, full, many[0])) == 11
    # the batch failed once, then: the report before it, the bad one alone, the ones after it
    # (a batch is sorted by job, stably: the bad one's place depends on the job ids)
    assert len(counted) <= 3 and gate.sizes[1] == 4


def test_a_stale_credential_or_a_missing_job_fails_alone(
    store: Store, writer: gc.ReportWriter
) -> None:
    ok, ended = running(store), running(store)
    gate, _ = held(writer, ok)
    store.jobs.update(ended, token_hash=None)  # its attempt ended: the credential is dead
    good = put(writer, ok, report(0))
    stale = put(writer, ended, report(0))
    wrong = put(writer, ok, report(20), token="thj_someone-else")
    missing = put(writer, 10**9, report(0))
    gate.opened.set()
    assert good.result(30) == 10
    for refused in (stale, wrong):
        with pytest.raises(gc.Refused, match="not valid for job"):
            refused.result(30)
    with pytest.raises(NotFound):
        missing.result(30)
    assert [s for s, _ in steps_of(store, ok)] == [*range(10), *range(10_000, 10_010)]
    assert store.metrics.count(ended) == 0


def test_an_attempt_that_ends_while_its_report_waits_to_be_stored_has_it_refused(
    store: Store, writer: gc.ReportWriter
) -> None:
    """The credential is checked in the transaction that stores the points, not before it: a
    report taken into a batch, then its attempt ended (the credential revoked) before the
    batch's transaction, is refused and nothing of it is stored."""
    job = running(store)
    gate, late = held(writer, job)  # the batch is taken; its transaction not begun
    store.jobs.update(job, token_hash=None)  # the attempt ends meanwhile
    gate.opened.set()
    with pytest.raises(gc.Refused, match="not valid for job"):
        late.result(30)
    assert store.metrics.count(job) == 0


def test_an_unexpected_error_stays_with_its_report(
    store: Store, writer: gc.ReportWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = [running(store) for _ in range(4)]
    add = gc.metrics.add

    def failing(conn: Any, dialect: str, job_id: int, columns: Columns, **kw: Any) -> int:
        if job_id == jobs[2]:
            raise RuntimeError("the disk is on fire")
        return add(conn, dialect, job_id, columns, **kw)

    gate, _ = held(writer, jobs[0])
    monkeypatch.setattr(gc.metrics, "add", failing)
    futures = [put(writer, job, report(0)) for job in jobs]
    gate.opened.set()
    with pytest.raises(RuntimeError, match="on fire"):
        futures[2].result(30)
    assert [f.result(30) for i, f in enumerate(futures) if i != 2] == [10, 10, 10]
    assert [len(steps_of(store, job)) for job in jobs] == [20, 10, 0, 10]


def test_each_batch_id_is_stored_once_within_a_batch_and_across(
    store: Store, writer: gc.ReportWriter
) -> None:
    job = running(store)
    gate, _ = held(writer, job)
    once = put(writer, job, report(0, value=0.5, batch_id="b1"))
    again = put(writer, job, report(0, value=0.25, batch_id="b1"))  # a retry: ignored
    later = put(writer, job, report(5, value=0.75))  # steps 5-14: replaces 5-9, in order
    gate.opened.set()
    assert (once.result(30), again.result(30), later.result(30)) == (10, 0, 10)
    assert gate.sizes == [1, 3]
    assert put(writer, job, report(0, value=9.0, batch_id="b1")).result(30) == 0
    stored = steps_of(store, job)
    assert stored[:15] == [(s, s + 0.5) for s in range(5)] + [(s, s + 0.75) for s in range(5, 15)]
    progress = store.jobs.get(job)
    assert (progress.last_step, progress.latest_metrics) == (14, {"loss": 14.75})  # the last
    assert store.metrics.count(job) == 15 + 10


def test_large_reports_share_a_transaction(store: Store, writer: gc.ReportWriter) -> None:
    """Two reports past PostgreSQL's COPY threshold in one transaction (each stages its own)."""
    jobs = [running(store) for _ in range(2)]
    gate, _ = held(writer, jobs[0])
    futures = [put(writer, job, report(0, 3000)) for job in jobs]
    futures.append(put(writer, jobs[1], report(3000, 3000)))
    gate.opened.set()
    assert [f.result(30) for f in futures] == [3000, 3000, 3000]
    assert gate.sizes == [1, 3]
    assert store.metrics.count(jobs[0]) == 3010 and store.metrics.count(jobs[1]) == 6000


def test_a_full_queue_refuses_and_stop_drains(store: Store) -> None:
    writer = gc.ReportWriter(store, queue_points=15)
    with pytest.raises(ServerBusy):  # not started
        put(writer, running(store), report(0))
    writer.start()
    job = running(store)
    gate, first = held(writer, job)
    queued = put(writer, job, report(0))  # 10 of 15 points
    with pytest.raises(ServerBusy, match="points queued") as busy:
        put(writer, job, report(10))
    assert busy.value.status == 503 and busy.value.retry_after > 0
    stopper = threading.Thread(target=writer.stop)
    stopper.start()
    with pytest.raises(ServerBusy, match="shutting down"):
        put(writer, job, report(20))
    gate.opened.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert (first.result(0), queued.result(0)) == (10, 10)  # stored before the writer ended
    assert store.metrics.count(job) == 20


def test_a_report_bigger_than_the_queue_goes_into_an_empty_one(store: Store) -> None:
    writer = gc.ReportWriter(store, queue_points=5)
    writer.start()
    try:
        assert put(writer, running(store), report(0)).result(30) == 10
    finally:
        writer.stop()


# -- the route ---------------------------------------------------------------------------------
@pytest.fixture
def small_queue(tmp_path: Path) -> Iterator[TestClient]:
    with app_client(tmp_path, exit_code=None, report_queue_points=15) as client:
        yield client


def test_the_route_answers_503_with_retry_after_when_the_queue_is_full(
    small_queue: TestClient, tmp_path: Path
) -> None:
    api = small_queue
    job = submit(api, "name: r\nentrypoint: python train.py\n", workdir(tmp_path)).json()["id"]
    wait_launched(api, job)
    writer = services(api).reports
    fake = services(api).scheduler.executor
    token = next(x.env.token for x in fake.launches if x.job_id == job)  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def body(first: int) -> dict[str, Any]:
        steps = list(range(first, first + 10))
        return {
            "batch_id": f"b{first}",
            "attempt": 1,
            "points": [[s, "loss", 1.0, None, 1.0] for s in steps],
        }

    gate = Gate()
    writer.before_batch = gate
    answers: dict[int, Any] = {}

    def post(first: int) -> None:
        answers[first] = api.post(f"/api/v1/jobs/{job}/report", json=body(first), headers=headers)

    threads = [threading.Thread(target=post, args=(0,))]
    threads[0].start()
    assert gate.entered.wait(10)  # the writer holds the first report
    threads.append(threading.Thread(target=post, args=(10,)))
    threads[1].start()
    while writer.queued() < 1:
        threading.Event().wait(0.01)
    refused = api.post(f"/api/v1/jobs/{job}/report", json=body(20), headers=headers)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1"
    assert error_of(refused)["code"] == "busy"
    gate.opened.set()
    for t in threads:
        t.join(30)
    assert [answers[k].status_code for k in (0, 10)] == [200, 200]
    assert [answers[k].json()["accepted"] for k in (0, 10)] == [10, 10]
    again = api.post(f"/api/v1/jobs/{job}/report", json=body(20), headers=headers)
    assert again.status_code == 200 and again.json()["accepted"] == 10


def test_then_runs_in_its_report_s_transaction_and_fails_with_it(
    store: Store, writer: gc.ReportWriter
) -> None:
    """A submit's ``then`` (a checkpoint's record) runs after its points in the same
    transaction, with the job as read: what it writes commits with the points, its answer
    comes with the report's; a ``then`` that raises takes its report's points and what it
    wrote along, and the rest of the batch is stored as ever. A submit without a report is
    its credential checked and its ``then``."""
    jobs = [running(store) for _ in range(3)]
    gate, _ = held(writer, jobs[0])

    def then(job_id: int, fail: bool = False) -> gc.Then:
        def run(conn: Any, job: Any) -> int:
            assert job.id == job_id
            ckpt = store.checkpoints.add(  # joins the writer's transaction
                job_id, attempt=1, step=9, path="c.pt", size=1, sha256="0" * 64
            )
            if fail:
                raise RuntimeError("the record could not be written")
            return ckpt.id

        return run

    token = hash_token(TOKEN)
    first = writer.submit(jobs[0], report(0), token, then=then(jobs[0]))
    failing = writer.submit(jobs[1], report(0), token, then=then(jobs[1], fail=True))
    alone = writer.submit(jobs[2], None, token, then=then(jobs[2]))
    refused = writer.submit(jobs[2], None, hash_token("thj_someone-else"), then=then(jobs[2]))
    gate.opened.set()
    stored = first.result(30)
    assert stored.accepted == 10
    assert [c.id for c in store.checkpoints.list(jobs[0])] == [stored.then]
    with pytest.raises(RuntimeError, match="could not be written"):
        failing.result(30)
    assert store.metrics.count(jobs[1]) == 0  # its points went with its record
    assert store.checkpoints.list(jobs[1], include_deleted=True) == []
    assert alone.result(30).accepted == 0
    assert [c.id for c in store.checkpoints.list(jobs[2])] == [alone.result(30).then]
    with pytest.raises(gc.Refused):
        refused.result(30)
    assert [s for s, _ in steps_of(store, jobs[0])] == [*range(10), *range(10_000, 10_010)]
