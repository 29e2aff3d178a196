from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tests.support.records import new_job as make_job
from tests.support.records import old_store
from trainhouse.errors import InvalidTransition, NotFound, StoreError
from trainhouse.lifecycle import JobState
from trainhouse.store import MetricPoint, Store
from trainhouse.store.tables import metadata


def new_job(store: Store, name: str = "j") -> int:
    spec = {"entrypoint": "python t.py", "max_restarts": 0}
    return make_job(store, name=name, owner="alice", spec=spec)


def test_migrated_schema_matches_tables(store: Store) -> None:
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []


def test_upgrade_is_idempotent(store: Store) -> None:
    store.upgrade()
    store.upgrade()


def test_create_and_get(store: Store) -> None:
    job_id = new_job(store)
    job = store.jobs.get(job_id)
    assert job.state is JobState.QUEUED
    assert job.owner == "alice"
    assert [e.to_state for e in store.jobs.events(job_id)] == ["QUEUED"]
    with pytest.raises(NotFound):
        store.jobs.get(999)


def test_lifecycle_through_store(store: Store) -> None:
    job_id = new_job(store)
    job, attempt = store.jobs.start_attempt(job_id, placement=(), token_hash="h")
    assert job.state is JobState.RUNNING and job.attempts == 1 and attempt.number == 1
    store.jobs.transition(job_id, JobState.RESTARTING, reason="boom", restarts=1)
    store.jobs.transition(job_id, JobState.QUEUED)
    _, attempt2 = store.jobs.start_attempt(job_id, placement=(), token_hash="h2")
    assert attempt2.number == 2
    done = store.jobs.transition(job_id, JobState.COMPLETED, reason="ok", exit_code=0)
    assert done.ended_at is not None and done.restarts == 1
    with pytest.raises(InvalidTransition):
        store.jobs.transition(job_id, JobState.RUNNING)
    states = [e.to_state for e in store.jobs.events(job_id)]
    assert states == ["QUEUED", "RUNNING", "RESTARTING", "QUEUED", "RUNNING", "COMPLETED"]
    assert [a.number for a in store.jobs.attempts(job_id)] == [1, 2]


def test_update_job_refuses_state(store: Store) -> None:
    job_id = new_job(store)
    with pytest.raises(StoreError, match=r"store\.jobs\.transition"):
        store.jobs.update(job_id, state="RUNNING")


def test_concurrent_starts_only_one_wins(store: Store) -> None:
    job_id = new_job(store)
    results: list[str] = []

    def start() -> None:
        try:
            store.jobs.start_attempt(job_id, placement=(), token_hash="x")
            results.append("ok")
        except StoreError:
            results.append("lost")

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == 1
    assert len(store.jobs.attempts(job_id)) == 1


def test_metrics_upsert_replaces_redone_steps(store: Store) -> None:
    job_id = new_job(store)
    store.metrics.add(job_id, [MetricPoint(s, "loss", 10.0 - s, attempt=1) for s in range(5)])
    # a restart from the checkpoint at step 2 logs steps 3.. again
    store.metrics.add(job_id, [MetricPoint(s, "loss", 100.0 + s, attempt=2) for s in (3, 4, 5)])
    pts = store.metrics.points(job_id, name="loss")
    assert [p.step for p in pts] == [0, 1, 2, 3, 4, 5]
    assert [p.value for p in pts][3:] == [103.0, 104.0, 105.0]
    assert [p.attempt for p in pts] == [1, 1, 1, 2, 2, 2]
    job = store.jobs.get(job_id)
    assert job.last_step == 5 and job.latest_metrics == {"loss": 105.0}


def test_metric_batches_are_idempotent(store: Store) -> None:
    job_id = new_job(store)
    pts = [MetricPoint(1, "loss", 1.0)]
    assert store.metrics.add(job_id, pts, batch_id="b1") == 1
    assert store.metrics.add(job_id, pts, batch_id="b1") == 0
    assert store.metrics.count(job_id) == 1


def test_rank_tagged_and_non_finite_metrics(store: Store) -> None:
    job_id = new_job(store)
    store.metrics.add(
        job_id,
        [
            MetricPoint(0, "loss", 1.0),
            MetricPoint(0, "loss", 2.0, rank=1),
            MetricPoint(1, "loss", None),
        ],
    )
    assert [p.value for p in store.metrics.points(job_id)] == [1.0, None]
    assert [p.value for p in store.metrics.points(job_id, rank=1)] == [2.0]
    assert len(store.metrics.points(job_id, all_ranks=True)) == 3


def test_progress_moves_back_after_restart(store: Store) -> None:
    job_id = new_job(store)
    store.metrics.add(job_id, [MetricPoint(9, "loss", 1.0)], total_steps=20)
    store.metrics.add(job_id, [MetricPoint(5, "loss", 2.0)])
    job = store.jobs.get(job_id)
    assert job.last_step == 5 and job.total_steps == 20


def test_checkpoints(store: Store) -> None:
    job_id = new_job(store)
    a = store.checkpoints.add(
        job_id, attempt=1, step=10, path="a.pt", size=3, sha256="a" * 64, metrics={"val_loss": 0.5}
    )
    store.checkpoints.add(job_id, attempt=1, step=20, path="b.pt", size=3, sha256="b" * 64)
    assert [c.step for c in store.checkpoints.list(job_id)] == [10, 20]
    store.checkpoints.mark_deleted([a.id])
    assert [c.step for c in store.checkpoints.list(job_id)] == [20]
    assert len(store.checkpoints.list(job_id, include_deleted=True)) == 2
    assert a.metrics == {"val_loss": 0.5}


def test_user_limits_and_usage(store: Store) -> None:
    from trainhouse.store import UserLimits

    assert store.quotas.limits() == {}
    store.quotas.set(UserLimits("ann", share=2.0, max_gpus=4))
    store.quotas.set(UserLimits("ann", share=3.0, max_gpus=None, max_cpus=8))
    assert store.quotas.limits() == {"ann": UserLimits("ann", 3.0, None, 8)}
    assert store.quotas.delete("ann") and not store.quotas.delete("ann")
    assert store.quotas.usage() == ({}, None)
    store.quotas.save_usage({"ann": 1.5, "bob": 0.25}, 100.0)
    store.quotas.save_usage({"ann": 2.5}, 200.0)
    assert store.quotas.usage() == ({"ann": 2.5}, 200.0)


def test_last_checkpoint_times(store: Store) -> None:
    a, b = new_job(store, "a"), new_job(store, "b")
    store.checkpoints.add(a, attempt=1, step=1, path="x.pt", size=1, sha256="a" * 64)
    times = store.checkpoints.last_times([a, b])
    assert set(times) == {a} and times[a] > 0
    assert store.checkpoints.last_times([]) == {}


def test_preempt_flag_round_trips(store: Store) -> None:
    job_id = new_job(store)
    assert store.jobs.get(job_id).preempt_requested is False
    store.jobs.update(job_id, preempt_requested=True)
    assert store.jobs.get(job_id).preempt_requested is True


def test_upgrading_an_old_schema_keeps_every_row(tmp_path: pytest.TempPathFactory) -> None:
    """Regression: migration 0002 once rebuilt `jobs` on SQLite and cascade-deleted history."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path}/old.db"  # type: ignore[operator]
    old = old_store(url, "0001")
    with old.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO attempts (job_id, number, started_at) VALUES (1,1,0)"))
        conn.execute(sa.text("INSERT INTO events (job_id, at, to_state) VALUES (1, 0, 'QUEUED')"))
        conn.execute(
            sa.text(
                "INSERT INTO metrics (job_id, attempt, rank, step, name, value, wall_time) "
                "VALUES (1, 1, -1, 0, 'loss', 1.0, 0)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO checkpoints (job_id, attempt, step, path, size, sha256, created_at, "
                "deleted) VALUES (1, 1, 0, 'a.pt', 1, 'x', 0, 0)"
            )
        )
    old.close()
    store = Store(url)
    try:
        assert store.jobs.get(1).preempt_requested is False
        assert len(store.jobs.attempts(1)) == 1
        assert len(store.jobs.events(1)) == 1
        assert store.metrics.count(1) == 1
        assert len(store.checkpoints.list(1)) == 1
        with store.engine.connect() as conn:  # foreign keys are back on afterwards
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        store.close()


def test_transition_expect_refuses_a_state_that_moved_on(store: Store) -> None:
    """Regression: a cancel decided on QUEUED must not cancel a job that just started."""
    job_id = new_job(store)
    store.jobs.start_attempt(job_id, placement=(), token_hash="h")
    with pytest.raises(InvalidTransition, match="is RUNNING now"):
        store.jobs.transition(job_id, JobState.CANCELED, expect=[JobState.QUEUED])
    assert store.jobs.get(job_id).state is JobState.RUNNING


def test_set_priority_only_while_queued(store: Store) -> None:
    job_id = new_job(store)
    assert store.jobs.set_priority(job_id, "high").spec.priority == "high"
    store.jobs.start_attempt(job_id, placement=(), token_hash="h")
    with pytest.raises(StoreError, match="only a queued job"):
        store.jobs.set_priority(job_id, "low")
    assert store.jobs.get(job_id).priority == "high"


def test_a_new_attempt_clears_a_preemption_request(store: Store) -> None:
    """Regression: a flag left from before a server crash stopped the next attempt at once."""
    job_id = new_job(store)
    store.jobs.start_attempt(job_id, placement=(), token_hash="h")
    store.jobs.update(job_id, preempt_requested=True)
    store.jobs.transition(job_id, JobState.RESTARTING)
    store.jobs.transition(job_id, JobState.QUEUED)
    job, _ = store.jobs.start_attempt(job_id, placement=(), token_hash="h2")
    assert job.preempt_requested is False


def test_resume_drops_steps_past_the_checkpoint_and_duplicates_in_a_batch(store: Store) -> None:
    job_id = new_job(store)
    store.metrics.add(job_id, [MetricPoint(s, "loss", 1.0, attempt=1) for s in range(10)])
    # attempt 2 resumed after step 4 and then died at step 6: steps 7..9 of attempt 1 are
    # not part of the lineage that produces the final model
    store.metrics.add(
        job_id,
        [MetricPoint(5, "loss", 2.0, attempt=2), MetricPoint(5, "loss", 3.0, attempt=2)],
        resume=(2, 4),
    )
    points = store.metrics.points(job_id)
    assert [p.step for p in points] == [0, 1, 2, 3, 4, 5]
    assert points[-1].value == 3.0


# -- the schema check and `trainhouse db` ---------------------------------------------------
# every test gets its own scratch PostgreSQL database (pg_url: created with a random name,
# dropped at the end)


def _stamp(store: Store, revision: str) -> None:
    """Pretend a newer trainhouse migrated the database."""
    import sqlalchemy as sa

    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


def _db(*args: str) -> tuple[int, str]:
    """``trainhouse db ARGS`` in-process: its exit code and everything it printed."""
    from typer.testing import CliRunner

    from trainhouse.cli.app import app

    result = CliRunner().invoke(app, ["db", *args], env={"COLUMNS": "300"})
    return result.exit_code, result.stdout + result.stderr


def _report(out: str) -> dict[str, object]:
    import json

    report: dict[str, object] = json.loads(out)
    return report


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/th.db"  # type: ignore[operator]
    url: str = request.getfixturevalue("pg_url")
    return url


def test_a_revision_this_trainhouse_does_not_know_is_refused(db_url: str) -> None:
    store = Store(db_url)
    head = store.schema_status().head
    _stamp(store, "f00d")
    status = store.schema_status()
    assert (status.revision, status.known, status.needs_upgrade) == ("f00d", False, False)
    with pytest.raises(StoreError, match="does not know"):
        store.upgrade()  # `trainhouse db upgrade` cannot help: this code has no way down
    store.close()
    message = (
        f"database schema is at revision f00d, which this trainhouse (head {head}) does not "
        "know; it was migrated by a newer trainhouse: upgrade trainhouse, or point --db at "
        "another database"
    )
    for migrate in (True, "always", "auto"):
        with pytest.raises(StoreError) as err:
            Store(db_url, migrate=migrate)  # type: ignore[arg-type]
        assert str(err.value) == message
    Store(db_url, migrate="never").close()  # the caller asked for no check

    code, out = _db("upgrade", "--db", db_url)
    assert code == 1 and "does not know" in out and "Traceback" not in out
    code, out = _db("current", "--db", db_url, "--json")
    assert code == 0, out
    assert _report(out) == {
        "database": db_url,
        "revision": "f00d",
        "head": head,
        "known": False,
        "needs_upgrade": False,
    }


def test_postgresql_is_never_migrated_by_the_server_only_by_db_upgrade(pg_url: str) -> None:
    import sqlalchemy as sa

    with pytest.raises(StoreError) as err:
        Store(pg_url, migrate="auto")  # an empty database
    head = Store(pg_url, migrate="never").schema_status().head
    assert str(err.value) == (
        f"database at revision none (no trainhouse schema yet) needs upgrading to {head}: "
        f"run `trainhouse db upgrade --db {pg_url}`"
    )
    old = old_store(pg_url, "0004")  # job 1, written as that revision's columns put it
    job_id = 1
    old.close()
    with pytest.raises(StoreError, match=f"at revision 0004 needs upgrading to {head}: run `tr"):
        Store(pg_url, migrate="auto")
    check = Store(pg_url, migrate="never")
    assert check.schema_status().revision == "0004"  # refusing changed nothing
    with check.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 1
    check.close()

    code, out = _db("current", "--db", pg_url)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[:3] == [f"database {pg_url}", "revision 0004", f"head     {head}"]
    assert lines[3] == f"status   needs an upgrade: run `trainhouse db upgrade --db {pg_url}`"

    code, out = _db("upgrade", "--db", pg_url)
    assert code == 0, out
    assert out.strip() == f"upgraded {pg_url} from revision 0004 to {head}"
    code, out = _db("upgrade", "--db", pg_url)
    assert code == 0 and out.strip() == f"{pg_url} is at revision {head}, already up to date"

    store = Store(pg_url, migrate="auto")  # what the server opens: accepted now
    try:
        assert store.jobs.get(job_id).name == "j"
        assert store.schema_status().up_to_date
    finally:
        store.close()
    code, out = _db("current", "--db", pg_url, "--json")
    assert _report(out) == {
        "database": pg_url,
        "revision": head,
        "head": head,
        "known": True,
        "needs_upgrade": False,
    }
    assert "status   up to date" in _db("current", "--db", pg_url)[1]


def test_the_embedded_sqlite_upgrades_itself(tmp_path: pytest.TempPathFactory) -> None:
    url = f"sqlite:///{tmp_path}/th.db"  # type: ignore[operator]
    old = Store(url, migrate=False)
    old.upgrade("0004")
    old.close()
    store = Store(url, migrate="auto")
    try:
        status = store.schema_status()
        assert status.up_to_date and status.revision == status.head
    finally:
        store.close()


def test_db_current_and_upgrade_default_to_the_servers_sqlite(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"  # type: ignore[operator]
    monkeypatch.setenv("TRAINHOUSE_HOME", str(home))
    code, out = _db("current", "--json")
    assert code == 0, out
    report = _report(out)
    assert report["database"] == f"sqlite:///{home / 'trainhouse.db'}"
    assert report["revision"] is None and report["needs_upgrade"] is True
    assert not home.exists()  # asking creates nothing
    code, out = _db("upgrade")
    assert code == 0 and "from revision none (empty)" in out, out
    other = tmp_path / "other"  # type: ignore[operator]
    assert _db("upgrade", "--home", str(other))[0] == 0
    assert _report(_db("current", "--home", str(other), "--json")[1])["needs_upgrade"] is False


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "cannot open database 'not a url': Could not parse"),
        ("nosuchdb://x/y", "cannot open database 'nosuchdb://x/y'"),
        (
            "postgresql+psycopg://postgres@127.0.0.1:1/x",
            "cannot reach the database postgresql+psycopg://postgres@127.0.0.1:1/x: "
            "connection failed",
        ),
        (
            "postgresql+psycopg://postgres:secret@127.0.0.1:1/x",
            "cannot reach the database postgresql+psycopg://postgres:***@127.0.0.1:1/x",
        ),
    ],
)
def test_db_commands_name_a_bad_or_unreachable_database(url: str, says: str) -> None:
    for command in ("upgrade", "current"):
        code, out = _db(command, "--db", url)
        assert code == 1, out
        assert out.startswith(f"error: {says}"), out
        assert "Traceback" not in out and "secret" not in out


def test_migrate_must_be_a_known_mode(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ValueError, match="migrate must be one of always, auto, never, got 'x'"):
        Store(f"sqlite:///{tmp_path}/x.db", migrate="x")  # type: ignore[arg-type]


def test_event_file_positions_are_kept_per_path_and_go_with_their_job(store: Store) -> None:
    """The TensorBoard import's read positions: set and moved per file (a path of any length
    or bytes a job chose), read back by a new server, deleted with the job."""
    from trainhouse.store.eventfiles import path_key

    job_id, other = new_job(store), new_job(store, "k")
    long = "sub/" * 500 + "events.out.tfevents.\udcff"
    store.event_files.save(job_id, {"events.out.tfevents.1": 120, long: 7})
    store.event_files.save(job_id, {"events.out.tfevents.1": 360})
    store.event_files.save(other, {"events.out.tfevents.1": 5})
    assert store.event_files.get(job_id) == {
        path_key("events.out.tfevents.1"): 360,
        path_key(long): 7,
    }
    store.jobs.transition(job_id, JobState.CANCELED, reason="test")
    assert store.runs.delete(job_id)["tensorboard_positions"] == 2
    assert store.event_files.get(job_id) == {}
    assert store.event_files.get(other) == {path_key("events.out.tfevents.1"): 5}
