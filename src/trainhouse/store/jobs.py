"""Jobs, their attempts and their events (``store.jobs``).

State changes go through :meth:`JobRepo.transition` (and :meth:`JobRepo.start_attempt`), which
check the lifecycle table (:func:`trainhouse.core.lifecycle.check_transition`) and write the new
state with a compare-and-set UPDATE in the same transaction as the event, so two threads (or two
servers on one PostgreSQL) can never both move a job out of the same state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Literal, get_args

from sqlalchemy import bindparam, case, delete, func, insert, select, update
from sqlalchemy.sql.elements import ColumnElement

from trainhouse.core.cluster import Placements, placements_to_json
from trainhouse.core.errors import InvalidTransition, NotFound, StoreError
from trainhouse.core.lifecycle import (
    RESUMABLE,
    JobState,
    StopReason,
    check_transition,
)
from trainhouse.core.records import Attempt, Event, Job
from trainhouse.core.spec import PRIORITY_TIERS, JobSpec
from trainhouse.store import tables as t
from trainhouse.store.jobrows import attempt_from_row, insert_job, job_filters, job_from_row

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["JOB_SORT_KEYS", "JobRepo", "JobSort"]

# names for annotations inside JobRepo, whose ``list`` method shadows the builtin there
JobList = list[Job]
AttemptList = list[Attempt]
EventList = list[Event]

JobSort = Literal["id", "created_at", "name", "owner", "state", "priority"]
JOB_SORT_KEYS: tuple[str, ...] = get_args(JobSort)


#: jobs by id (``JobRepo.get_many``): the ids a list, expanded as the query runs
_MANY = select(t.jobs).where(t.jobs.c.id.in_(bindparam("ids", expanding=True)))
#: the same, their rows locked in id order for the transaction (FOR SHARE)
_MANY_LOCKED = _MANY.order_by(t.jobs.c.id).with_for_update(read=True)


class JobRepo:
    """Every read and write of jobs, attempts and events."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- jobs ------------------------------------------------------------------------------
    def create(
        self,
        *,
        name: str,
        owner: str,
        priority: str,
        spec: JobSpec | Mapping[str, Any],
        archive_sha256: str,
        cloned_from: int | None = None,
        cloned_step: int | None = None,
        hold: bool = False,
        flow_id: int | None = None,
        flow_step: str | None = None,
    ) -> Job:
        """A new QUEUED job; ``spec`` is validated (a mapping is parsed) and stored as JSON.

        ``cloned_from``/``cloned_step``: the job (and its checkpoint's step) this one is a clone
        of. ``hold``: the scheduler leaves it alone until :meth:`release` (a clone waits
        there while its checkpoint is copied in). Its project, tags and hparams (for the runs
        table) come from the spec."""
        reason = "submitted"
        if cloned_from is not None:
            reason = f"cloned from job {cloned_from}" + (
                f" (its checkpoint of step {cloned_step})" if cloned_step is not None else ""
            )
        with self.db.transaction() as conn:
            job_id = insert_job(
                conn,
                name=name,
                owner=owner,
                priority=priority,
                spec=spec,
                archive_sha256=archive_sha256,
                cloned_from=cloned_from,
                cloned_step=cloned_step,
                hold=hold,
                reason=reason,
                flow_id=flow_id,
                flow_step=flow_step,
            )
        return self.get(job_id)

    def release(self, job_id: int) -> Job:
        """Let the scheduler start a job created with ``hold=True``."""
        self.update(job_id, held=False, reason="waiting for the scheduler")
        return self.get(job_id)

    def discard(self, job_id: int) -> None:
        """Remove a held job that never ran (a clone whose preparation failed), with its
        events; refused for any other job."""
        with self.db.transaction() as conn:
            result = conn.execute(
                delete(t.jobs).where(
                    t.jobs.c.id == job_id,
                    t.jobs.c.held.is_(True),
                    t.jobs.c.state == JobState.QUEUED,
                    t.jobs.c.attempts == 0,
                )
            )
        if result.rowcount != 1:
            raise StoreError(f"job {job_id} is not a held job that never ran; not discarded")

    def clones(self, job_id: int) -> JobList:
        """The jobs cloned from ``job_id``, oldest first."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.jobs).where(t.jobs.c.cloned_from == job_id).order_by(t.jobs.c.id)
            ).mappings()
            return [job_from_row(r) for r in rows]

    def resume(self, job_id: int, *, by: str, checkpoint_step: int | None) -> Job:
        """Send an ended job (CANCELED or FAILED) back to the queue, the same job, to continue
        from its latest checkpoint (step ``checkpoint_step``): its ``resumes`` counter goes up,
        its end (exit code, end time, cancel request) is cleared; the restart counters and
        attempts go on counting. The transition is the lifecycle table's. The models it read
        (``inputs:``) are resolved again as it starts: an upstream rerun since saved anew."""
        with self.db.transaction() as conn:
            conn.execute(delete(t.job_inputs).where(t.job_inputs.c.job_id == job_id))
            return self.transition(
                job_id,
                JobState.QUEUED,
                reason=f"resumed by {by} from its checkpoint of step {checkpoint_step}"
                if checkpoint_step is not None
                else f"resumed by {by} from the start (it saved no checkpoint)",
                expect=RESUMABLE,
                resumes=t.jobs.c.resumes + 1,
                ended_at=None,
                exit_code=None,
                cancel_requested=False,
                preempt_requested=False,
                resize_requested=False,
            )

    def get(self, job_id: int) -> Job:
        with self.db.connect() as conn:
            row = conn.execute(select(t.jobs).where(t.jobs.c.id == job_id)).mappings().first()
        if row is None:
            raise NotFound(f"job {job_id} does not exist")
        return job_from_row(row)

    def get_many(self, job_ids: Iterable[int], *, lock: bool = False) -> dict[int, Job]:
        """The jobs of ``job_ids`` that exist, by id (one query). ``lock`` (inside a
        transaction): no other transaction changes their rows before this one ends (PostgreSQL's
        ``FOR SHARE``, taken in id order; SQLite has one writer at a time anyway)."""
        query = _MANY_LOCKED if lock else _MANY  # built once: a report's batch reads them
        with self.db.connect() as conn:
            rows = conn.execute(query, {"ids": list(set(job_ids))}).mappings()
            return {row["id"]: job_from_row(row) for row in rows}

    def list(
        self,
        *,
        states: Iterable[JobState] | None = None,
        limit: int | None = None,
        offset: int = 0,
        owner: str | None = None,
        name: str | None = None,
        sort: JobSort = "id",
        order: Literal["asc", "desc"] = "desc",
        tracked: bool | None = False,
        ended_since: float | None = None,
    ) -> JobList:
        """A page of jobs, newest first by default.

        ``owner`` matches exactly, ``name`` is a case-insensitive substring; ``sort`` orders by
        a column (``priority`` by tier, low to urgent), ties broken by id in the same direction,
        so that pages taken with ``offset`` never repeat or skip a job. ``tracked``: False
        (the default: what the scheduler and the services see) the launched jobs only, True
        the tracked runs only (MLflow runs made outside a job), None both. ``ended_since``: only
        the jobs that ended at that time (``time.time()``) or later.
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
        where = job_filters(states, owner, name, tracked)
        if ended_since is not None:
            where.append(t.jobs.c.ended_at >= ended_since)
        query = (
            select(t.jobs)
            .where(*where)
            .order_by(*(k.desc() if order == "desc" else k.asc() for k in keys))
        )
        if offset:
            query = query.offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self.db.connect() as conn:
            return [job_from_row(r) for r in conn.execute(query).mappings()]

    def count(
        self,
        *,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        name: str | None = None,
        tracked: bool | None = False,
    ) -> int:
        """How many jobs :meth:`list` would return with these filters and no limit."""
        query = (
            select(func.count())
            .select_from(t.jobs)
            .where(*job_filters(states, owner, name, tracked))
        )
        with self.db.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def update(self, job_id: int, **fields: Any) -> None:
        """Update non-state fields (reason, requests, the credential's hash, progress)."""
        if "state" in fields:
            raise StoreError("state changes go through store.jobs.transition")
        fields.setdefault("updated_at", time.time())
        with self.db.transaction() as conn:
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
        with self.db.transaction() as conn:
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
        return self.get(job_id)

    def set_priority(self, job_id: int, priority: str) -> Job:
        """Change a queued job's tier (and its spec's), only while it is still queued."""
        job = self.get(job_id)
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.id == job_id, t.jobs.c.state == JobState.QUEUED)
                .values(
                    priority=priority,
                    spec={**job.spec_data, "priority": priority},
                    updated_at=time.time(),
                )
            )
        if result.rowcount != 1:
            raise StoreError(
                f"job {job_id} is {self.get(job_id).state}; only a queued job's priority can change"
            )
        return self.get(job_id)

    def request_cancel(self, job_id: int) -> Job:
        self.update(job_id, cancel_requested=True)
        return self.get(job_id)

    def cancel(self, job_id: int) -> Job:
        """The one cancel (of a job, a search's trial, a service's job): asked for, and a
        queued job ends CANCELED here at once; in any other state the scheduler loop ends it
        (if it started meanwhile, the compare-and-set refuses and the loop stops its
        processes). A tracked run (an MLflow run made outside a job) has no processes: it
        ends here too. Returns the job as it is now."""
        with self.db.transaction():
            job = self.request_cancel(job_id)
            ends_here = [JobState.QUEUED, JobState.RUNNING] if job.tracked else [JobState.QUEUED]
            if job.state in ends_here:
                # a lost compare-and-set (it started meanwhile) is no SQL error: the request
                # to cancel stands, and the loop ends it
                with suppress(StoreError):
                    job = self.transition(
                        job_id, JobState.CANCELED, reason=StopReason.CANCEL.text, expect=ends_here
                    )
        return job

    # -- events ----------------------------------------------------------------------------
    def events(self, job_id: int) -> EventList:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.events).where(t.events.c.job_id == job_id).order_by(t.events.c.id)
            ).mappings()
            return [Event(r["at"], r["from_state"], r["to_state"], r["reason"]) for r in rows]

    def add_event(self, job_id: int, reason: str) -> None:
        """Note something that happened to a job without changing its state."""
        with self.db.transaction() as conn:
            state = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job_id)).scalar_one()
            conn.execute(
                insert(t.events).values(
                    job_id=job_id, at=time.time(), from_state=state, to_state=state, reason=reason
                )
            )

    # -- attempts --------------------------------------------------------------------------
    def start_attempt(
        self, job_id: int, *, placement: Placements, token_hash: str
    ) -> tuple[Job, Attempt]:
        """QUEUED -> RUNNING with a new attempt row, in one transaction."""
        now = time.time()
        placed = placements_to_json(placement)
        with self.db.transaction() as conn:
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
                    placement=placed,
                    token_hash=token_hash,
                    preempt_requested=False,
                    resize_requested=False,
                    started_at=row[2] or now,
                    updated_at=now,
                    reason=None,
                )
            )
            if result.rowcount != 1:
                raise StoreError(f"job {job_id} changed state concurrently; try again")
            conn.execute(
                insert(t.attempts).values(
                    job_id=job_id, number=number, started_at=now, placement=placed
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
        return self.get(job_id), self.attempt(job_id, number)

    def attempt(self, job_id: int, number: int) -> Attempt:
        with self.db.connect() as conn:
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
        return attempt_from_row(row)

    def attempts(self, job_id: int) -> AttemptList:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.attempts)
                .where(t.attempts.c.job_id == job_id)
                .order_by(t.attempts.c.number)
            ).mappings()
            return [attempt_from_row(r) for r in rows]

    def update_attempt(self, job_id: int, number: int, **fields: Any) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                update(t.attempts)
                .where(t.attempts.c.job_id == job_id, t.attempts.c.number == number)
                .values(**fields)
            )
