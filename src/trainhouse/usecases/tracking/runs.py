"""MLflow's experiments and runs over trainhouse's jobs: find, make and move experiments,
make, read and update runs, log params, tags and metrics, read a metric's history.

A run is a job (its run id is the job's id): metrics are the job's series, stored through the
same group commit as the SDK's reports (:mod:`trainhouse.ingest.groupcommit`, one point per
(name, step): a step logged again replaces the value, as ``run.log`` does), params are its
reported hparams and tags its tags (:mod:`trainhouse.store.tracking`). Each use case takes the
:class:`~.callers.Caller` ``c``; who may reach which run is :mod:`.callers`.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainhouse.core.errors import InvalidMetrics, InvalidTracking, Refused
from trainhouse.core.records import Job
from trainhouse.core.reports import Columns, Report, check_columns
from trainhouse.core.tokens import hash_token
from trainhouse.store.tracking import RUN_STATUSES, Experiment, MlflowRun
from trainhouse.usecases import audit
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.tracking.callers import Caller, credential_hash, may_create, run_job

__all__ = [
    "MAX_HISTORY",
    "RUN_STATUSES",
    "Experiment",
    "HistoryPage",
    "LoggedPoint",
    "MlflowRun",
    "RunView",
    "create_experiment",
    "create_run",
    "experiment",
    "experiment_named",
    "get_run",
    "log_batch",
    "log_metrics",
    "log_params",
    "metric_history",
    "set_tags",
    "update_run",
]

#: points of one series answered by one metrics/get-history page at most (the default page;
#: the client asks for the next with the page token it was given)
MAX_HISTORY = 100_000

#: one logged metric point: name, value (None: not finite), step, wall time in seconds
LoggedPoint = tuple[str, float | None, int, float]


@dataclass(frozen=True)
class RunView:
    """A run as ``runs/get`` shows it: its job as of now, the job's MLflow view, its params
    and tags."""

    job: Job
    run: MlflowRun
    params: dict[str, str]
    tags: dict[str, str]
    #: the step of each of the job's own series' latest value
    steps: dict[str, int] = field(default_factory=dict)


# -- experiments -----------------------------------------------------------------------------
def _follow(rt: Runtime, c: Caller, exp: Experiment) -> Experiment:
    """Inside a job's scope the job's run moves to ``exp`` (``mlflow.set_experiment`` before
    ``start_run``: MLflow refuses a run id whose experiment is not the active one)."""
    if c.principal.is_job and c.job_id is not None:
        job = rt.store.jobs.get(c.job_id)
        rt.store.tracking.update_run(job, experiment_id=exp.id)
    return exp


def experiment_named(rt: Runtime, c: Caller, name: str) -> Experiment:
    """The experiment of that name (:class:`NotFound` if there is none: the client then makes
    it); a job's own run moves to it."""
    return _follow(rt, c, rt.store.tracking.experiment_named(name))


def experiment(rt: Runtime, c: Caller, number: int) -> Experiment:
    """Experiment ``number``; a job's own run moves to it."""
    return _follow(rt, c, rt.store.tracking.experiment(number))


def create_experiment(rt: Runtime, c: Caller, name: str) -> Experiment:
    """A new experiment (a member, an admin or a job's credential; :class:`AlreadyExists`
    when the name is taken); a job's own run moves to it."""
    may_create(c)
    return _follow(rt, c, rt.store.tracking.create_experiment(name))


# -- runs ------------------------------------------------------------------------------------
def _view(rt: Runtime, job: Job) -> RunView:
    run = rt.store.tracking.run(job)
    return RunView(
        job=rt.store.jobs.get(job.id),
        run=run,
        params=rt.store.tracking.values(job.id, "param"),
        tags=rt.store.tracking.values(job.id, "tag"),
        steps={s.name: s.last_step for s in rt.store.metrics.series(job.id) if s.rank is None},
    )


def create_run(
    rt: Runtime,
    c: Caller,
    *,
    experiment_id: int,
    run_name: str,
    start_time: int,
    tags: dict[str, str],
    user_id: str | None = None,
) -> RunView:
    """A new run: inside a job (its credential, or its scope's URI) the job itself, in
    experiment ``experiment_id``; outside one a tracked run, listed with the jobs, owned by the
    caller (with auth off: by ``user_id`` when sent), audited as ``mlflow.run.create``."""
    may_create(c)
    run_name = run_name or tags.get("mlflow.runName", "")
    if c.job_id is not None:
        job = rt.store.jobs.get(c.job_id)
        rt.store.tracking.experiment(experiment_id)
        rt.store.tracking.update_run(
            job, status="RUNNING", run_name=run_name or None, experiment_id=experiment_id
        )
        rt.store.tracking.put(job.id, "tag", tags)
        return _view(rt, job)
    p = c.principal
    user = p.name
    if not p.authenticated:  # auth off: the owner is the name the client sends
        user = user_id or user
    run_name = run_name or f"run-{secrets.token_hex(3)}"
    tags.setdefault("mlflow.runName", run_name)
    with rt.store.transaction():
        job = rt.store.tracking.create_tracked(
            owner=user,
            run_name=run_name,
            experiment_id=experiment_id,
            start_time=start_time,
            token_hash=hash_token(secrets.token_urlsafe(32)),  # a token nobody holds
            tags=tags,
        )
        audit.record(rt, p, "mlflow.run.create", f"job:{job.id}", name=job.name)
    return _view(rt, job)


def get_run(rt: Runtime, c: Caller, number: int) -> RunView:
    """Run ``number``, if ``c`` may read it."""
    return _view(rt, run_job(rt, c, number, write=False))


def update_run(
    rt: Runtime,
    c: Caller,
    number: int,
    *,
    status: str | None = None,
    end_time: int | None = None,
    run_name: str | None = None,
) -> tuple[Job, MlflowRun]:
    """A run's status (one of :data:`RUN_STATUSES`), end time or name; a tracked run's job
    ends with it (FINISHED: COMPLETED, FAILED: FAILED, KILLED: CANCELED). A launched job's
    state stays the scheduler's. Returns the job as of now and its MLflow view."""
    job = run_job(rt, c, number, write=True)
    run = rt.store.tracking.update_run(job, status=status, end_time=end_time, run_name=run_name)
    return rt.store.jobs.get(job.id), run


# -- logging ---------------------------------------------------------------------------------
def log_params(rt: Runtime, c: Caller, job: Job, values: dict[str, str]) -> None:
    """Store params of ``job`` (one ``c`` may write: :func:`~.callers.run_job`); a param
    logged again with another value is refused (:class:`ValueChanged`)."""
    rt.store.tracking.put(job.id, "param", values)


def set_tags(rt: Runtime, c: Caller, job: Job, values: dict[str, str]) -> None:
    """Store (replace) tags of ``job`` (one ``c`` may write)."""
    rt.store.tracking.put(job.id, "tag", values)


async def log_metrics(rt: Runtime, c: Caller, job: Job, points: Sequence[LoggedPoint]) -> None:
    """Metrics of ``job`` (one ``c`` may write) through the report path: checked, then one
    group commit. A credential the writer refuses (the job's attempt ended) is refused as any
    token is (401, counted against the caller's address)."""
    if not points:
        return
    names = [name for name, _, _, _ in points]
    attempt = max(1, job.attempts)
    try:
        columns = check_columns(
            Columns(
                [step for _, _, step, _ in points],
                names,
                [value for _, value, _, _ in points],
                [None] * len(names),
                [wall for _, _, _, wall in points],
                attempt,
            ),
            "metrics",
        )
    except InvalidMetrics as exc:
        raise InvalidTracking(str(exc)) from None
    report = Report(uuid.uuid4().hex, attempt, columns)
    try:
        stored = await asyncio.wrap_future(
            rt.reports.submit(job.id, report, credential_hash(c, job))
        )
    except Refused:
        why = f"the credential is not valid for job {job.id}'s current attempt"
        token = c.token or ""
        raise await asyncio.to_thread(rt.auth.refuse, c.principal.client, why, token) from None
    rt.telemetry.points.inc(stored.accepted)
    # a search's trial: its objective goes to the pruner as the SDK's reports do (a trial it
    # prunes is stopped by the scheduler, an MLflow-only script as any other)
    if stored.job.search_id is not None and not stored.job.prune_requested:
        await asyncio.to_thread(rt.tune.on_report, stored.job, columns)


async def log_batch(
    rt: Runtime,
    c: Caller,
    job: Job,
    *,
    params: dict[str, str],
    tags: dict[str, str],
    metrics: Sequence[LoggedPoint],
) -> None:
    """Params and tags of ``job`` (one ``c`` may write) first, then its metrics in one
    report (:func:`log_metrics`)."""
    if params or tags:

        def put() -> None:
            rt.store.tracking.put(job.id, "param", params)
            rt.store.tracking.put(job.id, "tag", tags)

        await asyncio.to_thread(put)
    await log_metrics(rt, c, job, metrics)


@dataclass(frozen=True)
class HistoryPage:
    """A page of a series' points (step, value or None, wall time), in step order, and the
    token of the next page (None: the last)."""

    points: list[tuple[int, float | None, float]]
    next_token: str | None


def metric_history(
    rt: Runtime,
    c: Caller,
    number: int,
    key: str,
    *,
    max_results: int | None = None,
    page_token: str | None = None,
) -> HistoryPage:
    """A page of run ``number``'s own series ``key``: every point (one per step), at most
    ``max_results`` (:data:`MAX_HISTORY` at most, and by default), past the step the
    ``page_token`` of the page before names. Empty when it has no such series."""
    limit = MAX_HISTORY if max_results is None else max_results
    if not 1 <= limit <= MAX_HISTORY:
        raise InvalidTracking(f"max_results must be from 1 to {MAX_HISTORY}, got {limit}")
    after = -1
    if page_token:
        if not (page_token.isascii() and page_token.isdigit() and len(page_token) <= 19):
            raise InvalidTracking(f"page_token {page_token[:40]!r} is no token this server gave")
        after = int(page_token)
    job = run_job(rt, c, number, write=False)
    found = rt.store.metrics.series(job.id, name=key)
    if not found:
        return HistoryPage([], None)
    rows = rt.store.metrics.page(job.id, found[0], after_step=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return HistoryPage(rows, str(rows[-1][0]) if more else None)
