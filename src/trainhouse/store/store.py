"""The Store: every read and write of trainhouse's state, for SQLite and PostgreSQL alike.

State changes go through :meth:`Store.transition`, which checks the lifecycle table and writes
the new state with a compare-and-set UPDATE, so two threads (or two servers on one PostgreSQL)
can never both move a job out of the same state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import RowMapping

from trainhouse.errors import InvalidTransition, NotFound, StoreError
from trainhouse.scheduler.lifecycle import JobState, check_transition
from trainhouse.store import tables as t
from trainhouse.store.records import Attempt, Checkpoint, Event, Job, MetricPoint, UserLimits


def default_db_url(home: Path) -> str:
    return f"sqlite:///{home / 'trainhouse.db'}"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit (a submitted job, a stored metric batch) is on disk before it is
    # acknowledged, even if the machine loses power; NORMAL in WAL mode may lose the last ones
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _job(row: RowMapping) -> Job:
    data = {k: row[k] for k in Job.__dataclass_fields__}
    data["state"] = JobState(data["state"])
    data["cancel_requested"] = bool(data["cancel_requested"])
    data["preempt_requested"] = bool(data["preempt_requested"])
    data["latest_metrics"] = data["latest_metrics"] or {}
    return Job(**data)


def _attempt(row: RowMapping) -> Attempt:
    return Attempt(**{k: row[k] for k in Attempt.__dataclass_fields__})


def _checkpoint(row: RowMapping) -> Checkpoint:
    data = {k: row[k] for k in Checkpoint.__dataclass_fields__}
    data["metrics"] = data["metrics"] or {}
    data["deleted"] = bool(data["deleted"])
    return Checkpoint(**data)


class Store:
    """Everything trainhouse persists. Thread-safe: each method uses its own transaction."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        self.url = url
        self.dialect = url.split(":", 1)[0].split("+", 1)[0]
        kwargs: dict[str, Any] = {}
        if self.dialect == "sqlite":
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
        try:
            self.engine: Engine = create_engine(url, **kwargs)
        except Exception as exc:  # bad URL, missing driver
            raise StoreError(f"cannot open database {url!r}: {exc}") from None
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        if migrate:
            self.upgrade()

    # -- schema ----------------------------------------------------------------------------
    def alembic_config(self) -> Config:
        cfg = Config()
        cfg.set_main_option(
            "script_location", str(resources.files("trainhouse.store") / "migrations")
        )
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Apply every Alembic migration not yet applied (idempotent).

        On SQLite, foreign keys are off while migrations run: a table rebuilt by a batch
        migration must not cascade-delete the rows that point at it.
        """
        cfg = self.alembic_config()
        with self.engine.connect() as conn:
            if self.dialect == "sqlite":
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                conn.commit()
            try:
                with conn.begin():
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, revision)
            finally:
                if self.dialect == "sqlite":
                    conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                    conn.commit()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    # -- jobs ------------------------------------------------------------------------------
    def create_job(
        self, *, name: str, owner: str, priority: str, spec: dict[str, Any], archive_sha256: str
    ) -> Job:
        now = time.time()
        with self._tx() as conn:
            job_id = conn.execute(
                insert(t.jobs)
                .values(
                    name=name,
                    owner=owner,
                    state=JobState.QUEUED,
                    priority=priority,
                    spec=spec,
                    archive_sha256=archive_sha256,
                    created_at=now,
                    updated_at=now,
                    attempts=0,
                    restarts=0,
                    cancel_requested=False,
                    reason="waiting for the scheduler",
                )
                .returning(t.jobs.c.id)
            ).scalar_one()
            conn.execute(
                insert(t.events).values(
                    job_id=job_id,
                    at=now,
                    from_state=None,
                    to_state=JobState.QUEUED,
                    reason="submitted",
                )
            )
        return self.get_job(job_id)

    def get_job(self, job_id: int) -> Job:
        with self.engine.connect() as conn:
            row = conn.execute(select(t.jobs).where(t.jobs.c.id == job_id)).mappings().first()
        if row is None:
            raise NotFound(f"job {job_id} does not exist")
        return _job(row)

    def list_jobs(
        self, *, states: Iterable[JobState] | None = None, limit: int | None = None
    ) -> list[Job]:
        query = select(t.jobs).order_by(t.jobs.c.id.desc())
        if states is not None:
            query = query.where(t.jobs.c.state.in_([str(s) for s in states]))
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_job(r) for r in conn.execute(query).mappings()]

    def update_job(self, job_id: int, **fields: Any) -> None:
        """Update non-state fields (reason, placement, progress)."""
        if "state" in fields:
            raise StoreError("state changes go through Store.transition")
        fields.setdefault("updated_at", time.time())
        with self._tx() as conn:
            result = conn.execute(update(t.jobs).where(t.jobs.c.id == job_id).values(**fields))
        if result.rowcount == 0:
            raise NotFound(f"job {job_id} does not exist")

    def transition(
        self,
        job_id: int,
        new: JobState,
        *,
        reason: str | None = None,
        expect: Iterable[JobState] | None = None,
        **fields: Any,
    ) -> Job:
        """Move a job to ``new`` if the lifecycle table allows it; record the event.

        ``expect``: only from these states (checked in the same compare-and-set), for callers
        that decided on a state they read earlier.
        """
        now = time.time()
        with self._tx() as conn:
            row = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job_id)).first()
            if row is None:
                raise NotFound(f"job {job_id} does not exist")
            current = JobState(row[0])
            if expect is not None and current not in set(expect):
                raise InvalidTransition(f"job {job_id} is {current} now; not moved to {new}")
            check_transition(job_id, current, new)
            values: dict[str, Any] = {"state": new, "updated_at": now, **fields}
            if reason is not None:
                values["reason"] = reason
            if new.terminal:
                values.setdefault("ended_at", now)
            result = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.id == job_id, t.jobs.c.state == current)
                .values(**values)
            )
            if result.rowcount != 1:
                raise StoreError(f"job {job_id} changed state concurrently; try again")
            conn.execute(
                insert(t.events).values(
                    job_id=job_id, at=now, from_state=current, to_state=new, reason=reason
                )
            )
        return self.get_job(job_id)

    def events(self, job_id: int) -> list[Event]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.events).where(t.events.c.job_id == job_id).order_by(t.events.c.id)
            ).mappings()
            return [Event(r["at"], r["from_state"], r["to_state"], r["reason"]) for r in rows]

    def set_priority(self, job_id: int, priority: str) -> Job:
        """Change a queued job's tier (and its spec's), only while it is still queued."""
        job = self.get_job(job_id)
        with self._tx() as conn:
            result = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.id == job_id, t.jobs.c.state == JobState.QUEUED)
                .values(
                    priority=priority,
                    spec={**job.spec, "priority": priority},
                    updated_at=time.time(),
                )
            )
        if result.rowcount != 1:
            raise StoreError(
                f"job {job_id} is {self.get_job(job_id).state}; only a queued job's priority "
                "can change"
            )
        return self.get_job(job_id)

    def request_cancel(self, job_id: int) -> Job:
        self.update_job(job_id, cancel_requested=True)
        return self.get_job(job_id)

    # -- attempts --------------------------------------------------------------------------
    def start_attempt(
        self, job_id: int, *, placement: dict[str, Any], token_hash: str
    ) -> tuple[Job, Attempt]:
        """QUEUED -> RUNNING with a new attempt row, in one transaction."""
        now = time.time()
        with self._tx() as conn:
            row = conn.execute(
                select(t.jobs.c.state, t.jobs.c.attempts, t.jobs.c.started_at).where(
                    t.jobs.c.id == job_id
                )
            ).first()
            if row is None:
                raise NotFound(f"job {job_id} does not exist")
            check_transition(job_id, row[0], JobState.RUNNING)
            number = row[1] + 1
            result = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.id == job_id, t.jobs.c.state == row[0])
                .values(
                    state=JobState.RUNNING,
                    attempts=number,
                    placement=placement,
                    token_hash=token_hash,
                    preempt_requested=False,
                    started_at=row[2] or now,
                    updated_at=now,
                    reason=None,
                )
            )
            if result.rowcount != 1:
                raise StoreError(f"job {job_id} changed state concurrently; try again")
            conn.execute(
                insert(t.attempts).values(
                    job_id=job_id, number=number, started_at=now, placement=placement
                )
            )
            conn.execute(
                insert(t.events).values(
                    job_id=job_id,
                    at=now,
                    from_state=row[0],
                    to_state=JobState.RUNNING,
                    reason=f"attempt {number} started",
                )
            )
        return self.get_job(job_id), self.get_attempt(job_id, number)

    def get_attempt(self, job_id: int, number: int) -> Attempt:
        with self.engine.connect() as conn:
            row = (
                conn.execute(
                    select(t.attempts).where(
                        t.attempts.c.job_id == job_id, t.attempts.c.number == number
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"job {job_id} has no attempt {number}")
        return _attempt(row)

    def attempts(self, job_id: int) -> list[Attempt]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t.attempts)
                .where(t.attempts.c.job_id == job_id)
                .order_by(t.attempts.c.number)
            ).mappings()
            return [_attempt(r) for r in rows]

    def update_attempt(self, job_id: int, number: int, **fields: Any) -> None:
        with self._tx() as conn:
            conn.execute(
                update(t.attempts)
                .where(t.attempts.c.job_id == job_id, t.attempts.c.number == number)
                .values(**fields)
            )

    # -- metrics ---------------------------------------------------------------------------
    def add_metrics(
        self,
        job_id: int,
        points: Sequence[MetricPoint],
        *,
        batch_id: str | None = None,
        total_steps: int | None = None,
        resume: tuple[int, int] | None = None,
    ) -> int:
        """Store points; a (name, rank, step) seen before is replaced. Returns points written.

        A ``batch_id`` already seen for this job is ignored, so a client may retry a batch.
        ``resume=(attempt, step)``: that attempt resumed after ``step``, so points earlier
        attempts logged past it are dropped first (the series is the final lineage).
        """
        now = time.time()
        with self._tx() as conn:
            if batch_id is not None:
                seen = conn.execute(
                    select(t.report_batches.c.batch_id).where(
                        t.report_batches.c.job_id == job_id,
                        t.report_batches.c.batch_id == batch_id,
                    )
                ).first()
                if seen is not None:
                    return 0
                conn.execute(
                    insert(t.report_batches).values(job_id=job_id, batch_id=batch_id, at=now)
                )
            if resume is not None:
                attempt, step = resume
                conn.execute(
                    delete(t.metrics).where(
                        t.metrics.c.job_id == job_id,
                        t.metrics.c.step > step,
                        t.metrics.c.attempt < attempt,
                    )
                )
            if points:
                # the same (name, rank, step) twice in one batch: the last one wins
                latest_points = {(p.name, p.rank, p.step): p for p in points}
                rows = [
                    {
                        "job_id": job_id,
                        "attempt": p.attempt,
                        "rank": -1 if p.rank is None else p.rank,
                        "step": p.step,
                        "name": p.name,
                        "value": p.value,
                        "wall_time": p.wall_time or now,
                    }
                    for p in latest_points.values()
                ]
                ins = (pg_insert if self.dialect == "postgresql" else sqlite_insert)(t.metrics)
                conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=["job_id", "name", "rank", "step"],
                        set_={
                            "value": ins.excluded.value,
                            "attempt": ins.excluded.attempt,
                            "wall_time": ins.excluded.wall_time,
                        },
                    ),
                    rows,
                )
            progress: dict[str, Any] = {}
            job_points = [p for p in points if p.rank is None]
            if job_points:
                last = max(p.step for p in job_points)
                latest = {p.name: p.value for p in job_points if p.step == last}
                current = conn.execute(
                    select(t.jobs.c.last_step, t.jobs.c.latest_metrics).where(t.jobs.c.id == job_id)
                ).first()
                if current is not None:
                    if current[0] is None or last > current[0]:
                        progress.update(last_step=last, latest_metrics=latest)
                    elif last == current[0]:
                        progress["latest_metrics"] = {**(current[1] or {}), **latest}
                    # a smaller step means a restart from an earlier checkpoint: the step
                    # counter moves back with it
                    else:
                        progress.update(last_step=last, latest_metrics=latest)
            if total_steps is not None:
                progress["total_steps"] = total_steps
            if progress:
                progress["updated_at"] = now
                conn.execute(update(t.jobs).where(t.jobs.c.id == job_id).values(**progress))
        return len(points)

    def metrics(
        self,
        job_id: int,
        *,
        name: str | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
    ) -> list[MetricPoint]:
        query = select(t.metrics).where(t.metrics.c.job_id == job_id)
        if name is not None:
            query = query.where(t.metrics.c.name == name)
        if not all_ranks:
            query = query.where(t.metrics.c.rank == (-1 if rank is None else rank))
        query = query.order_by(t.metrics.c.name, t.metrics.c.rank, t.metrics.c.step)
        with self.engine.connect() as conn:
            return [
                MetricPoint(
                    step=r["step"],
                    name=r["name"],
                    value=r["value"],
                    rank=None if r["rank"] < 0 else r["rank"],
                    attempt=r["attempt"],
                    wall_time=r["wall_time"],
                )
                for r in conn.execute(query).mappings()
            ]

    def metric_count(self, job_id: int) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(t.metrics).where(t.metrics.c.job_id == job_id)
                ).scalar_one()
            )

    # -- checkpoints -----------------------------------------------------------------------
    def add_checkpoint(
        self,
        job_id: int,
        *,
        attempt: int,
        step: int,
        path: str,
        size: int,
        sha256: str,
        metrics: dict[str, float | None] | None = None,
        kind: str = "file",
    ) -> Checkpoint:
        with self._tx() as conn:
            ckpt_id = conn.execute(
                insert(t.checkpoints)
                .values(
                    job_id=job_id,
                    attempt=attempt,
                    step=step,
                    path=path,
                    size=size,
                    sha256=sha256,
                    metrics=metrics or {},
                    created_at=time.time(),
                    deleted=False,
                    kind=kind,
                )
                .returning(t.checkpoints.c.id)
            ).scalar_one()
            row = (
                conn.execute(select(t.checkpoints).where(t.checkpoints.c.id == ckpt_id))
                .mappings()
                .one()
            )
        return _checkpoint(row)

    def checkpoints(self, job_id: int, *, include_deleted: bool = False) -> list[Checkpoint]:
        query = select(t.checkpoints).where(t.checkpoints.c.job_id == job_id)
        if not include_deleted:
            query = query.where(t.checkpoints.c.deleted.is_(False))
        query = query.order_by(t.checkpoints.c.step, t.checkpoints.c.id)
        with self.engine.connect() as conn:
            return [_checkpoint(r) for r in conn.execute(query).mappings()]

    def get_checkpoint(self, job_id: int, checkpoint_id: int) -> Checkpoint:
        with self.engine.connect() as conn:
            row = (
                conn.execute(
                    select(t.checkpoints).where(
                        t.checkpoints.c.job_id == job_id, t.checkpoints.c.id == checkpoint_id
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"job {job_id} has no checkpoint {checkpoint_id}")
        return _checkpoint(row)

    def mark_checkpoint_corrupt(self, checkpoint_id: int, reason: str) -> None:
        with self._tx() as conn:
            conn.execute(
                update(t.checkpoints)
                .where(t.checkpoints.c.id == checkpoint_id, t.checkpoints.c.corrupt.is_(None))
                .values(corrupt=reason)
            )

    def add_event(self, job_id: int, reason: str) -> None:
        """Note something that happened to a job without changing its state."""
        with self._tx() as conn:
            state = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job_id)).scalar_one()
            conn.execute(
                insert(t.events).values(
                    job_id=job_id, at=time.time(), from_state=state, to_state=state, reason=reason
                )
            )

    def mark_checkpoints_deleted(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self._tx() as conn:
            conn.execute(
                update(t.checkpoints).where(t.checkpoints.c.id.in_(ids)).values(deleted=True)
            )

    # -- scheduling: limits, usage, checkpoint times ---------------------------------------
    def user_limits(self) -> dict[str, UserLimits]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.user_limits).order_by(t.user_limits.c.owner)).mappings()
            return {r["owner"]: UserLimits(**r) for r in rows}

    def set_user_limits(self, limits: UserLimits) -> UserLimits:
        values = {"share": limits.share, "max_gpus": limits.max_gpus, "max_cpus": limits.max_cpus}
        with self._tx() as conn:
            found = conn.execute(
                update(t.user_limits).where(t.user_limits.c.owner == limits.owner).values(**values)
            )
            if found.rowcount == 0:
                conn.execute(insert(t.user_limits).values(owner=limits.owner, **values))
        return limits

    def delete_user_limits(self, owner: str) -> bool:
        with self._tx() as conn:
            result = conn.execute(delete(t.user_limits).where(t.user_limits.c.owner == owner))
        return result.rowcount > 0

    def usage(self) -> tuple[dict[str, float], float | None]:
        """Decayed fair-share usage per user and when it was last saved."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.user_usage)).mappings().all()
        if not rows:
            return {}, None
        return {r["owner"]: r["usage"] for r in rows}, max(r["updated_at"] for r in rows)

    def save_usage(self, values: dict[str, float], at: float) -> None:
        with self._tx() as conn:
            conn.execute(delete(t.user_usage))
            if values:
                conn.execute(
                    insert(t.user_usage),
                    [{"owner": o, "usage": u, "updated_at": at} for o, u in values.items()],
                )

    def last_checkpoint_times(self, job_ids: Sequence[int]) -> dict[int, float]:
        if not job_ids:
            return {}
        query = (
            select(t.checkpoints.c.job_id, func.max(t.checkpoints.c.created_at))
            .where(t.checkpoints.c.job_id.in_(list(job_ids)))
            .group_by(t.checkpoints.c.job_id)
        )
        with self.engine.connect() as conn:
            return {int(j): float(at) for j, at in conn.execute(query)}
