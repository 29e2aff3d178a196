"""PostgreSQL in production: many clients at once against one server (on each backend), and
a server that refuses a database whose schema it does not serve."""

from __future__ import annotations

import itertools
import random
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.servers import Server, assert_clean_stop, database_of, db_upgrade, start_server
from trainhouse.client import Client
from trainhouse.client.serverprocess import ServerProcess, free_port
from trainhouse.errors import ClientError, InvalidTransition, ServerStartError
from trainhouse.lifecycle import TERMINAL, JobState, check_transition
from trainhouse.store.store import Store

pytestmark = pytest.mark.integration

CLIENTS = 16
JOBS_EACH = 5


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[Server]:
    """Two CPU cores for 80 one-core jobs: most of them wait in the queue."""
    srv = start_server(tmp_path / "home", "--cpus", "2", "--cancel-grace", "1")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def write_spec(tmp_path: Path) -> Path:
    wd = tmp_path / "job"
    wd.mkdir()
    (wd / "train.py").write_text("print('hello')\n")
    (wd / "job.yaml").write_text(
        textwrap.dedent(
            """
            name: tiny
            entrypoint: python train.py
            resources: {procs_per_node: 1, cpus_per_proc: 1}
            """
        )
    )
    return wd / "job.yaml"


def in_parallel(work: Callable[[int], None]) -> None:
    """``work(i)`` for every client at the same moment; fails with the first error any raised."""
    barrier = threading.Barrier(CLIENTS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            work(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"client-{i}") for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not [t for t in threads if t.is_alive()], "a client thread hung"
    if errors:
        raise errors[0]


def cancel(c: Client, job_id: int) -> None:
    """Cancel, as a user who clicks twice or races the job's end: an ended job is no error."""
    try:
        c.cancel(job_id)
    except ClientError as exc:
        if exc.status != 409 or "has already ended" not in str(exc):
            raise


def wait_until(srv: Server, done: Callable[[list[dict[str, object]]], bool]) -> None:
    deadline = time.monotonic() + 240
    with srv.client as c:
        while not done(c.jobs(all=True)):
            assert time.monotonic() < deadline, "the jobs did not get there in 240 s"
            time.sleep(0.5)


def test_many_clients_submit_and_cancel_at_once(small_server: Server, tmp_path: Path) -> None:
    srv = small_server
    spec = write_spec(tmp_path)
    submitted: dict[int, list[int]] = {}

    def submit_and_cancel(i: int) -> None:
        with Client(srv.url) as c:
            ids = submitted.setdefault(i, [])
            for n in range(JOBS_EACH):
                ids.append(c.submit(spec, overrides=[f"name=c{i:02d}-j{n}"])["id"])
                if n % 2:  # while the other clients still submit
                    cancel(c, ids[-1])

    in_parallel(submit_and_cancel)
    ids = sorted(job_id for each in submitted.values() for job_id in each)
    assert len(ids) == CLIENTS * JOBS_EACH
    assert len(set(ids)) == len(ids), f"an id was handed out twice: {ids}"

    def some_completed(jobs: list[dict[str, object]]) -> bool:
        return sum(j["state"] == "COMPLETED" for j in jobs) >= 2

    wait_until(srv, some_completed)  # the scheduler ran some while the rest waited

    def cancel_the_rest(i: int) -> None:
        # every job not ended yet is canceled by two clients at once
        mine = submitted[i] + submitted[(i + 1) % CLIENTS]
        random.Random(i).shuffle(mine)
        with Client(srv.url) as c:
            for job_id in mine:
                cancel(c, job_id)

    in_parallel(cancel_the_rest)
    wait_until(srv, lambda jobs: all(j["state"] in TERMINAL for j in jobs))

    with srv.client as c:
        listed = c.jobs(all=True)
    assert sorted(int(str(j["id"])) for j in listed) == ids, "a job was lost or listed twice"
    names = {str(j["name"]) for j in listed}
    assert names == {f"c{i:02d}-j{n}" for i in range(CLIENTS) for n in range(JOBS_EACH)}
    finals = {str(j["state"]) for j in listed}
    assert finals <= {"CANCELED", "COMPLETED"}, finals
    assert "COMPLETED" in finals

    store = Store(srv.db_url, migrate="never")
    try:
        for job_id in ids:
            check_history(store, job_id)
    finally:
        store.close()
    log = srv.log_tail(1_000_000)
    assert "Traceback" not in log, log[-5000:]


def check_history(store: Store, job_id: int) -> None:
    """The stored transitions are one chain through the lifecycle table, ending in the job's
    one final state; a job canceled before it started never ran."""
    job = store.jobs.get(job_id)
    events = store.jobs.events(job_id)
    assert events[0].from_state is None and events[0].to_state == JobState.QUEUED
    for before, after in itertools.pairwise(events):
        assert after.from_state == before.to_state, (job_id, events)
        try:
            check_transition(job_id, str(after.from_state), after.to_state)
        except InvalidTransition as exc:
            raise AssertionError(f"job {job_id}: {exc}: {events}") from None
    assert events[-1].to_state == job.state, (job_id, job.state, events)
    assert sum(JobState(e.to_state) in TERMINAL for e in events) == 1, events
    attempts = store.jobs.attempts(job_id)
    started = sum(e.to_state == JobState.RUNNING for e in events)
    assert len(attempts) == started == job.attempts, (job_id, attempts, events)
    if job.state is JobState.COMPLETED:
        assert started == 1 and attempts[0].exit_code == 0, (job_id, attempts)


def test_a_server_refuses_an_unmigrated_postgresql_database(pg_url: str, tmp_path: Path) -> None:
    """Production upgrades are the operator's step: the server never migrates PostgreSQL."""
    proc = ServerProcess(tmp_path / "home", free_port(), "--db", pg_url, log=tmp_path / "s.log")
    with pytest.raises(ServerStartError, match=r"exited with code [1-9]") as err:
        proc.start(timeout=60)
    message = " ".join(str(err.value).split())
    assert f"needs upgrading to {head()}: run `trainhouse db upgrade --db {pg_url}`" in message
    assert "Traceback" not in message
    db_upgrade(pg_url)  # what the message says
    proc = ServerProcess(tmp_path / "home", free_port(), "--db", pg_url, log=tmp_path / "s2.log")
    proc.start(timeout=60)
    assert proc.stop() in (0, -15)


def test_a_server_refuses_a_schema_it_does_not_know(backend: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    url = database_of(home)
    db_upgrade(url)
    store = Store(url, migrate="never")
    try:
        with store.engine.begin() as conn:  # as a newer trainhouse's migration would leave it
            conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00d'"))
    finally:
        store.close()
    proc = ServerProcess(home, free_port(), "--db", url, log=tmp_path / "s.log")
    with pytest.raises(ServerStartError, match=r"exited with code [1-9]") as err:
        proc.start(timeout=60)
    message = " ".join(str(err.value).split())
    assert (
        f"database schema is at revision f00d, which this trainhouse (head {head()}) does not "
        "know; it was migrated by a newer trainhouse: upgrade trainhouse, or point --db at "
        "another database"
    ) in message
    assert "Traceback" not in message


def head() -> str:
    store = Store("sqlite://", migrate="never")
    try:
        return store.schema_status().head
    finally:
        store.close()
