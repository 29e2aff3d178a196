"""Tracking (``store.tracking``): MLflow experiments, the MLflow view of jobs, params and tags.

Every job can be an MLflow run (its run id is the job's id): a job whose script logs through
MLflow gets a row in ``mlflow_runs`` the first time it is asked for (its experiment, run name and
MLflow status; the job's own state stays the scheduler's), and an MLflow run made outside the
server is a job of kind "tracked" (:data:`~trainhouse.core.records.TRACKED`), made here RUNNING
in one transaction and never scheduled (:meth:`JobRepo.list` leaves it out by default). Params
and tags live in ``run_values``: a param, once logged, keeps its value (MLflow's rule), a tag is
replaced. Experiment ``0``, "Default", always exists and is not stored.

A job's MLflow experiment names its project (the runs table's ``project``) when its spec names
none: the spec's ``project:`` first, then the experiment the run is in (the latest it moved
to; "Default" is the ``default`` project), else ``default`` (:func:`project_name`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from trainhouse.core.errors import AlreadyExists, InvalidTracking, NotFound, ValueChanged
from trainhouse.core.lifecycle import JobState, check_transition
from trainhouse.core.records import TRACKED, Job
from trainhouse.core.spec import JobSpec
from trainhouse.core.spec.model import check_reported_hparams
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from trainhouse.store.database import Database
    from trainhouse.store.jobs import JobRepo

__all__ = [
    "DEFAULT_EXPERIMENT",
    "AlreadyExists",
    "Experiment",
    "MlflowRun",
    "TrackingRepo",
    "ValueChanged",
]

DEFAULT_EXPERIMENT = "Default"
ValueKind = Literal["param", "tag"]
#: MLflow's run states and the job state a tracked run takes with each
RUN_STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
ENDED = {"FINISHED": JobState.COMPLETED, "FAILED": JobState.FAILED, "KILLED": JobState.CANCELED}


@dataclass(frozen=True)
class Experiment:
    id: int
    name: str
    created_at: float


@dataclass(frozen=True)
class MlflowRun:
    """The MLflow view of job ``job_id``."""

    job_id: int
    experiment_id: int
    run_name: str
    user_id: str
    status: str
    start_time: int  # ms
    end_time: int | None


_NOT_NAME = re.compile(r"[^\w.\-]+")


def job_name(run_name: str) -> str:
    """A job name (the spec's rules) for an MLflow run name: other characters become ``-``."""
    name = _NOT_NAME.sub("-", run_name.strip()).strip("-._")[:128]
    return name if name and name[0].isascii() and name[0].isalnum() else f"run-{name}"[:128]


def project_name(experiment: str) -> str:
    """The project (the spec's rules) a job takes from its MLflow experiment's name: other
    characters become ``-``; the "Default" experiment (or a name with nothing left) is the
    ``default`` project."""
    if experiment == DEFAULT_EXPERIMENT:
        return "default"
    name = _NOT_NAME.sub("-", experiment.strip()).strip("-._")[:128]
    if not name:
        return "default"
    return name if name[0].isascii() and name[0].isalnum() else f"mlflow-{name}"[:128]


def _follow_experiment(conn: Connection, job: Job, experiment: Experiment) -> None:
    """A job whose spec names no project (``default``) takes its experiment's name as its
    project (the runs table's); a project the spec names wins."""
    if job.spec.project != "default":
        return
    conn.execute(
        update(t.jobs).where(t.jobs.c.id == job.id).values(project=project_name(experiment.name))
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class TrackingRepo:
    def __init__(self, db: Database, jobs: JobRepo) -> None:
        self.db = db
        self.jobs = jobs

    # -- experiments -------------------------------------------------------------------------
    def experiment(self, experiment_id: int) -> Experiment:
        if experiment_id == 0:
            return Experiment(0, DEFAULT_EXPERIMENT, 0.0)
        with self.db.connect() as conn:
            row = conn.execute(
                select(t.mlflow_experiments).where(t.mlflow_experiments.c.id == experiment_id)
            ).first()
        if row is None:
            raise NotFound(f"experiment {experiment_id} does not exist")
        return Experiment(row.id, row.name, row.created_at)

    def experiment_named(self, name: str) -> Experiment:
        if name == DEFAULT_EXPERIMENT:
            return Experiment(0, DEFAULT_EXPERIMENT, 0.0)
        with self.db.connect() as conn:
            row = conn.execute(
                select(t.mlflow_experiments).where(t.mlflow_experiments.c.name == name)
            ).first()
        if row is None:
            raise NotFound(f"no experiment is named {name!r}")
        return Experiment(row.id, row.name, row.created_at)

    def create_experiment(self, name: str) -> Experiment:
        """A new experiment; :class:`AlreadyExists` when the name is taken."""
        if name == DEFAULT_EXPERIMENT:
            raise AlreadyExists(f"an experiment named {name!r} already exists")
        try:
            with self.db.transaction() as conn:
                new = conn.execute(
                    insert(t.mlflow_experiments)
                    .values(name=name, created_at=time.time())
                    .returning(t.mlflow_experiments.c.id)
                ).scalar_one()
        except IntegrityError:
            raise AlreadyExists(f"an experiment named {name!r} already exists") from None
        return self.experiment(int(new))

    def experiment_for(self, name: str) -> Experiment:
        """The experiment named ``name``, made if missing (two callers at once get one)."""
        try:
            return self.experiment_named(name)
        except NotFound:
            pass
        try:
            return self.create_experiment(name)
        except AlreadyExists:
            return self.experiment_named(name)

    # -- runs --------------------------------------------------------------------------------
    def create_tracked(
        self,
        *,
        owner: str,
        run_name: str,
        experiment_id: int,
        start_time: int | None,
        token_hash: str,
        tags: Mapping[str, str] = {},
    ) -> Job:
        """A tracked run: a job of kind "tracked", RUNNING from the start (never scheduled),
        with its MLflow row and tags, in one transaction. ``token_hash`` is what its metric
        reports are checked against (:mod:`trainhouse.ingest.groupcommit`)."""
        project = project_name(self.experiment(experiment_id).name)
        now = time.time()
        name = job_name(run_name)
        spec = JobSpec(name=name, entrypoint="mlflow")  # what it was: a run logged to us
        with self.db.transaction() as conn:
            job_id = conn.execute(
                insert(t.jobs)
                .values(
                    name=name,
                    owner=owner,
                    state=JobState.RUNNING,
                    priority="normal",
                    spec=spec.model_dump(mode="json"),
                    archive_sha256="",
                    created_at=now,
                    updated_at=now,
                    started_at=now,
                    attempts=1,
                    restarts=0,
                    cancel_requested=False,
                    reason="an MLflow run logged to this server (tracked, not launched)",
                    token_hash=token_hash,
                    kind=TRACKED,
                    # the experiment's name is the project (the column's default otherwise)
                    **({"project": project} if project != "default" else {}),
                )
                .returning(t.jobs.c.id)
            ).scalar_one()
            conn.execute(
                insert(t.events).values(
                    job_id=job_id,
                    at=now,
                    from_state=None,
                    to_state=JobState.RUNNING,
                    reason="an MLflow run was created (tracked, not launched)",
                )
            )
            conn.execute(
                insert(t.mlflow_runs).values(
                    job_id=job_id,
                    experiment_id=experiment_id,
                    run_name=run_name,
                    user_id=owner,
                    status="RUNNING",
                    start_time=start_time if start_time is not None else _now_ms(),
                    end_time=None,
                )
            )
            _put_values(conn, self.db.dialect, job_id, "tag", tags)
        return self.jobs.get(int(job_id))

    def run(self, job: Job) -> MlflowRun:
        """The MLflow view of ``job``, made from the job the first time it is asked for."""
        with self.db.connect() as conn:
            row = conn.execute(
                select(t.mlflow_runs).where(t.mlflow_runs.c.job_id == job.id)
            ).first()
        if row is not None:
            return _run(row)
        status = "RUNNING" if not job.state.terminal else _status_of(job.state)
        values = {
            "job_id": job.id,
            "experiment_id": 0,
            "run_name": job.name[:250],
            "user_id": job.owner[:256],
            "status": status,
            "start_time": int((job.started_at or job.created_at) * 1000),
            "end_time": None,
        }
        try:
            with self.db.transaction() as conn:
                conn.execute(insert(t.mlflow_runs).values(**values))
        except IntegrityError:  # made meanwhile by another request
            pass
        with self.db.connect() as conn:
            row = conn.execute(select(t.mlflow_runs).where(t.mlflow_runs.c.job_id == job.id)).one()
        return _run(row)

    def update_run(
        self,
        job: Job,
        *,
        status: str | None = None,
        end_time: int | None = None,
        run_name: str | None = None,
        experiment_id: int | None = None,
    ) -> MlflowRun:
        """Change the MLflow view of ``job``; a tracked run's job follows its status (FINISHED:
        COMPLETED, FAILED, KILLED: CANCELED; RUNNING again after an end is refused)."""
        current = self.run(job)
        fields: dict[str, object] = {}
        if status is not None:
            fields["status"] = status
            if status in ENDED:
                fields["end_time"] = end_time if end_time is not None else _now_ms()
        elif end_time is not None:
            fields["end_time"] = end_time
        if run_name:
            fields["run_name"] = run_name
        moved_to = self.experiment(experiment_id) if experiment_id is not None else None
        if moved_to is not None:
            fields["experiment_id"] = moved_to.id
        now = time.time()
        with self.db.transaction() as conn:
            if moved_to is not None:
                _follow_experiment(conn, job, moved_to)
            if fields:
                conn.execute(
                    update(t.mlflow_runs).where(t.mlflow_runs.c.job_id == job.id).values(**fields)
                )
            if job.tracked and run_name:
                conn.execute(
                    update(t.jobs)
                    .where(t.jobs.c.id == job.id)
                    .values(name=job_name(run_name), updated_at=now)
                )
            if job.tracked and status is not None and status != current.status:
                _follow(conn, job, status, now)
        return self.run(job)

    # -- params and tags ---------------------------------------------------------------------
    def put(self, job_id: int, kind: ValueKind, values: Mapping[str, str]) -> None:
        """Store params or tags. A param logged again with another value is refused
        (:class:`AlreadyExists`, nothing stored), as MLflow refuses it."""
        if not values:
            return
        with self.db.transaction() as conn:
            if kind == "param":
                found = conn.execute(
                    select(t.run_values.c.key, t.run_values.c.value).where(
                        t.run_values.c.job_id == job_id,
                        t.run_values.c.kind == "param",
                        t.run_values.c.key.in_(list(values)),
                    )
                )
                old = {row.key: row.value for row in found}
                for key, value in values.items():
                    if key in old and old[key] != value:
                        raise ValueChanged(
                            f"param {key!r} was logged as {old[key][:100]!r}; a param keeps "
                            f"its first value (got {value[:100]!r})"
                        )
                values = {k: v for k, v in values.items() if k not in old}
                _report_hparams(conn, job_id, values)
            _put_values(conn, self.db.dialect, job_id, kind, values)

    def values(self, job_id: int, kind: ValueKind) -> dict[str, str]:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.run_values.c.key, t.run_values.c.value)
                .where(t.run_values.c.job_id == job_id, t.run_values.c.kind == kind)
                .order_by(t.run_values.c.key)
            )
            return {row.key: row.value for row in rows}


def _param_value(text: str) -> int | float | str:
    """An MLflow param (always a string) as the hparam it stands for: a number where it reads
    as one, so that the runs table filters and sorts it as a number."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _report_hparams(conn: Connection, job_id: int, params: Mapping[str, str]) -> None:
    """New MLflow params are hparams the run reports using: merged into the job's reported
    hparams (``jobs.hparams``, as ``run.set_hparams`` does) and its runs-table rows."""
    if not params:
        return
    from trainhouse.store.jobrows import hparam_rows

    reported = conn.execute(select(t.jobs.c.hparams).where(t.jobs.c.id == job_id)).scalar()
    added = {key: _param_value(value) for key, value in params.items()}
    merged = {**(reported or {}), **added}
    try:  # the cap the SDK's reports have (the params refused, nothing stored)
        check_reported_hparams(merged)
    except ValueError as e:
        raise InvalidTracking(f"{e}: the run's params would pass it") from None
    conn.execute(
        update(t.jobs).where(t.jobs.c.id == job_id).values(hparams=merged, updated_at=time.time())
    )
    rows = hparam_rows(job_id, added)
    if rows:
        keys = [row["key"] for row in rows]
        h = t.job_hparams
        conn.execute(delete(h).where(h.c.job_id == job_id, h.c.key.in_(keys)))
        conn.execute(insert(h), rows)


def _put_values(
    conn: Connection, dialect: str, job_id: int, kind: ValueKind, values: Mapping[str, str]
) -> None:
    if not values:
        return
    rows = [{"job_id": job_id, "kind": kind, "key": k, "value": v} for k, v in values.items()]
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    stmt = upsert(t.run_values).values(rows)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["job_id", "kind", "key"], set_={"value": stmt.excluded.value}
        )
    )


def _follow(conn: Connection, job: Job, status: str, now: float) -> None:
    """Move a tracked run's job to the state its MLflow status says (a compare-and-set on the
    state read now: an ended job stays ended)."""
    state = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job.id)).scalar_one()
    new = ENDED.get(status)
    if new is None or JobState(state).terminal:
        return
    check_transition(job.id, state, new)
    conn.execute(
        update(t.jobs)
        .where(t.jobs.c.id == job.id, t.jobs.c.state == state)
        .values(state=new, ended_at=now, updated_at=now, reason=f"the MLflow run ended ({status})")
    )
    conn.execute(
        insert(t.events).values(
            job_id=job.id,
            at=now,
            from_state=state,
            to_state=new,
            reason=f"the MLflow run ended ({status})",
        )
    )


def _status_of(state: JobState) -> str:
    return {JobState.COMPLETED: "FINISHED", JobState.FAILED: "FAILED"}.get(state, "KILLED")


def _run(row: object) -> MlflowRun:
    return MlflowRun(
        job_id=row.job_id,  # type: ignore[attr-defined]
        experiment_id=row.experiment_id,  # type: ignore[attr-defined]
        run_name=row.run_name,  # type: ignore[attr-defined]
        user_id=row.user_id,  # type: ignore[attr-defined]
        status=row.status,  # type: ignore[attr-defined]
        start_time=row.start_time,  # type: ignore[attr-defined]
        end_time=row.end_time,  # type: ignore[attr-defined]
    )
