"""The Store: every read and write of trainhouse's state, for SQLite and PostgreSQL alike.

State changes go through :meth:`Store.transition`, which checks the lifecycle table and writes
the new state with a compare-and-set UPDATE, so two threads (or two servers on one PostgreSQL)
can never both move a job out of the same state.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Connection,
    Engine,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from trainhouse.errors import InvalidTransition, NotFound, StoreError
from trainhouse.lifecycle import JobState, check_transition
from trainhouse.spec import PRIORITY_TIERS
from trainhouse.store import metrics as metric_store
from trainhouse.store import series as series_store
from trainhouse.store import tables as t
from trainhouse.store.records import Attempt, Checkpoint, Event, Job, MetricPoint, UserLimits


def default_db_url(home: Path) -> str:
    return f"sqlite:///{home / 'trainhouse.db'}"


def _without_password(url: str) -> str:
    """A database URL with its password hidden (as SQLAlchemy shows it), parsable or not."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


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


JobSort = Literal["id", "created_at", "name", "owner", "state", "priority"]
JOB_SORT_KEYS: tuple[str, ...] = get_args(JobSort)


def _job_filters(
    states: Iterable[JobState] | None, owner: str | None, name: str | None
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if states is not None:
        where.append(t.jobs.c.state.in_([str(s) for s in states]))
    if owner:
        where.append(t.jobs.c.owner == owner)
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append(func.lower(t.jobs.c.name).like(f"%{escaped.lower()}%", escape="\\"))
    return where


MigrateMode = Literal["always", "auto", "never"]
MIGRATE_MODES: tuple[str, ...] = get_args(MigrateMode)


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands against the migrations this trainhouse ships."""

    revision: str | None  # the database's Alembic revision; None: no trainhouse schema yet
    head: str  # the newest revision this trainhouse knows
    known: bool  # whether this trainhouse knows the database's revision (None counts as known)

    @property
    def up_to_date(self) -> bool:
        return self.revision == self.head

    @property
    def needs_upgrade(self) -> bool:
        return self.known and not self.up_to_date


class Store:
    """Everything trainhouse persists. Thread-safe: each method uses its own transaction."""

    def __init__(self, url: str, *, migrate: bool | MigrateMode = True) -> None:
        """Open the database at ``url`` and bring its schema to this trainhouse's head.

        ``migrate`` says what happens to a schema older than this code's: ``"always"`` (or
        True) applies the missing migrations; ``"auto"`` applies them on SQLite (the embedded
        default: a newcomer never runs a command) and refuses any other database (upgrading a
        production database is the operator's explicit step, ``trainhouse db upgrade``);
        ``"never"`` (or False) neither checks nor migrates (the caller handles the schema).
        A revision this code does not know (a newer trainhouse migrated the database) is
        refused in every mode but ``"never"``.
        """
        mode = "always" if migrate is True else "never" if migrate is False else migrate
        if mode not in MIGRATE_MODES:
            raise ValueError(f"migrate must be one of {', '.join(MIGRATE_MODES)}, got {mode!r}")
        self.url = url
        self.dialect = url.split(":", 1)[0].split("+", 1)[0]
        kwargs: dict[str, Any] = {}
        if self.dialect == "sqlite":
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            # request threads (up to 40 in the server's pool) each need a connection: with
            # SQLAlchemy's default 5 + 10 they queued for one under load (bench/load.py)
            kwargs["pool_size"] = 20
            kwargs["max_overflow"] = 20
            if self.dialect == "postgresql" and "connect_timeout" not in url:
                kwargs["connect_args"] = {"connect_timeout": 10}  # an unreachable host fails
        try:
            self.engine: Engine = create_engine(url, **kwargs)
        except Exception as exc:  # bad URL, missing driver
            shown = _without_password(url)
            detail = str(exc).replace(url, shown)  # a bad URL is quoted whole
            raise StoreError(f"cannot open database {shown!r}: {detail}") from None
        #: the URL with its password hidden, for messages and logs
        self.safe_url = self.engine.url.render_as_string(hide_password=True)
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        if mode != "never":
            try:
                self.prepare_schema(upgrade=mode == "always" or self.dialect == "sqlite")
            except BaseException:
                self.engine.dispose()
                raise

    # -- schema ----------------------------------------------------------------------------
    def alembic_config(self) -> Config:
        cfg = Config()
        cfg.set_main_option(
            "script_location", str(resources.files("trainhouse.store") / "migrations")
        )
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        return cfg

    @staticmethod
    def _reason(exc: SQLAlchemyError) -> str:
        """The driver's message on one line (psycopg's span several)."""
        cause = getattr(exc, "orig", None) or exc
        return " ".join(str(cause).split())

    def schema_status(self) -> SchemaStatus:
        """The database's Alembic revision against this code's head (reads, never writes)."""
        script = ScriptDirectory.from_config(self.alembic_config())
        known = {rev.revision for rev in script.walk_revisions()}
        try:
            with self.engine.connect() as conn:
                current = MigrationContext.configure(conn).get_current_heads()
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot reach the database {self.safe_url}: {self._reason(exc)}"
            ) from None
        return SchemaStatus(
            revision=",".join(current) or None,
            head=",".join(script.get_heads()),
            known=all(rev in known for rev in current),
        )

    def _refuse_unknown(self, status: SchemaStatus) -> None:
        if not status.known:
            raise StoreError(
                f"database schema is at revision {status.revision}, which this trainhouse "
                f"(head {status.head}) does not know; it was migrated by a newer trainhouse: "
                "upgrade trainhouse, or point --db at another database"
            )

    def prepare_schema(self, *, upgrade: bool) -> SchemaStatus:
        """Check the schema; migrate an older one to head if ``upgrade``, else refuse it."""
        status = self.schema_status()
        self._refuse_unknown(status)
        if status.up_to_date:
            return status
        if not upgrade:
            raise StoreError(
                f"database at revision {status.revision or 'none (no trainhouse schema yet)'} "
                f"needs upgrading to {status.head}: run "
                f"`trainhouse db upgrade --db {shlex.quote(self.safe_url)}`"
            )
        self._migrate("head")
        return SchemaStatus(revision=status.head, head=status.head, known=True)

    def upgrade(self, revision: str = "head") -> None:
        """Apply every Alembic migration not yet applied up to ``revision`` (idempotent).

        Refuses a database at a revision this code does not know (a newer trainhouse's).
        """
        self._refuse_unknown(self.schema_status())
        self._migrate(revision)

    def _migrate(self, revision: str) -> None:
        """Run Alembic's upgrade on one connection.

        On SQLite, foreign keys are off while migrations run: a table rebuilt by a batch
        migration must not cascade-delete the rows that point at it.
        """
        cfg = self.alembic_config()
        try:
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
        except SQLAlchemyError as exc:
            raise StoreError(
                f"cannot upgrade the database {self.safe_url} to {revision}: {self._reason(exc)}"
            ) from None

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
        self,
        *,
        states: Iterable[JobState] | None = None,
        limit: int | None = None,
        offset: int = 0,
        owner: str | None = None,
        name: str | None = None,
        sort: JobSort = "id",
        order: Literal["asc", "desc"] = "desc",
    ) -> list[Job]:
        """A page of jobs, newest first by default.

        ``owner`` matches exactly, ``name`` is a case-insensitive substring; ``sort`` orders by
        a column (``priority`` by tier, low to urgent), ties broken by id in the same direction,
        so that pages taken with ``offset`` never repeat or skip a job.
        """
        if sort not in JOB_SORT_KEYS:
            raise StoreError(f"jobs sort by one of {', '.join(JOB_SORT_KEYS)}, not {sort!r}")
        key: ColumnElement[Any] = (
            case(
                {tier: rank for rank, tier in enumerate(PRIORITY_TIERS)},
                value=t.jobs.c.priority,
                else_=-1,
            )
            if sort == "priority"
            else t.jobs.c[sort]
        )
        keys = [key, t.jobs.c.id] if sort != "id" else [key]
        query = (
            select(t.jobs)
            .where(*_job_filters(states, owner, name))
            .order_by(*(k.desc() if order == "desc" else k.asc() for k in keys))
        )
        if offset:
            query = query.offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_job(r) for r in conn.execute(query).mappings()]

    def count_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        name: str | None = None,
    ) -> int:
        """How many jobs :meth:`list_jobs` would return with these filters and no limit."""
        query = select(func.count()).select_from(t.jobs).where(*_job_filters(states, owner, name))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

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
            if current is JobState.RUNNING:
                # the attempt's credential dies with the attempt (a new one comes with the next)
                values.setdefault("token_hash", None)
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

    # -- metrics (trainhouse.store.metrics, trainhouse.store.series) ---------------------------
    def add_metrics(
        self,
        job_id: int,
        points: Sequence[MetricPoint] | metric_store.Columns,
        *,
        batch_id: str | None = None,
        total_steps: int | None = None,
        resume: tuple[int, int] | None = None,
    ) -> int:
        """Store points; a (name, rank, step) seen before is replaced. Returns points written.

        ``points``: MetricPoints, or :class:`~trainhouse.store.metrics.Columns` checked by
        ``metrics.check_columns`` (the report route's fast path).
        A ``batch_id`` already seen for this job is ignored, so a client may retry a batch.
        ``resume=(attempt, step)``: that attempt resumed after ``step``, so points earlier
        attempts logged past it are dropped first (the series is the final lineage).
        """
        columns = (
            points
            if isinstance(points, metric_store.Columns)
            else metric_store.columns_from_points(points)
        )
        with self._tx() as conn:
            return metric_store.add(
                conn,
                self.dialect,
                job_id,
                columns,
                batch_id=batch_id,
                total_steps=total_steps,
                resume=resume,
            )

    def metrics(
        self,
        job_id: int,
        *,
        name: str | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
    ) -> list[MetricPoint]:
        """Every point (ordered by name, rank, step); large reads use :meth:`metric_points`."""
        return series_store.legacy_points(
            self.engine, job_id, name=name, rank=rank, all_ranks=all_ranks
        )

    def metric_series(
        self,
        job_id: int,
        *,
        name: str | None = None,
        rank: int | None = None,
        all_ranks: bool = False,
        after_step: int | None = None,
    ) -> list[series_store.SeriesInfo]:
        """The job's series with their point counts and step ranges (past ``after_step``)."""
        return series_store.series(
            self.engine, job_id, name=name, rank=rank, all_ranks=all_ranks, after_step=after_step
        )

    def metric_points(
        self, job_id: int, info: series_store.SeriesInfo, *, max_points: int = 0
    ) -> series_store.SeriesPoints:
        """One series' points in ``info``'s step range; at most ``max_points`` (0: all),
        downsampled in SQL keeping each step bucket's extremes and the first and last points."""
        return series_store.points(self.engine, job_id, info, max_points=max_points)

    def metric_count(self, job_id: int) -> int:
        return series_store.count(self.engine, job_id)

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
