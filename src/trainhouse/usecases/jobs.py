"""Jobs: submit, list (with the visibility rules), show, cancel, and read their metrics and
checkpoints. Each use case takes the caller, checks what it may do, does the work in one
transaction with its audit entry, and wakes the scheduler when the queue changed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

from trainhouse.core import envspec
from trainhouse.core.datasets import Pin, staging_phase
from trainhouse.core.errors import (
    Forbidden,
    InvalidMetrics,
    InvalidQuery,
    NotFound,
    QueryError,
    SpecError,
    StoreError,
)
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Attempt, Checkpoint, Event, InputPin, Job, Promotion
from trainhouse.core.runquery import Field, parse_field, parse_fields
from trainhouse.core.runquery import parse as parse_query
from trainhouse.jobfs.layout import LAUNCHER
from trainhouse.scheduler.failures import attempt_log
from trainhouse.store.jobs import JOB_SORT_KEYS
from trainhouse.store.series import MIN_DOWNSAMPLED, SeriesInfo
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import accepted_spec, owner_of, store_workdir

MAX_COLUMNS = 50  # columns of one runs-table page

__all__ = [
    "JOB_SORT_KEYS",
    "MAX_COLUMNS",
    "MIN_DOWNSAMPLED",
    "JobDetail",
    "JobPage",
    "cancel",
    "checkpoint",
    "checkpoint_bytes",
    "checkpoint_files",
    "checkpoints",
    "detail",
    "metric_series",
    "page",
    "series_names",
    "state_summary",
    "submit",
    "view",
]


def state_summary(job: Job) -> str:
    """Where ``job`` stands, said from its state and counters alone: what someone who may not
    read the job sees instead of its reason, which may quote its log (a failed job's last
    lines, the line a ``no_restart_on`` pattern matched)."""
    state = job.state
    if state is JobState.RUNNING:
        return f"running attempt {job.attempts}" + (
            "; asked to yield its resources"
            if job.preempt_requested
            else "; asked to stop at a checkpoint for a resize"
            if job.resize_requested
            else ""
        )
    if state is JobState.FAILED and job.exit_code is not None:
        return f"failed with exit code {job.exit_code}"
    return state.lower()


def _staging_now(rt: Runtime | None, job: Job) -> str | None:
    """Where staging a running job's datasets stands while it stages (None once it is done, or
    for a job that pins none): read from its launcher's log."""
    if rt is None or job.state is not JobState.RUNNING or job.last_step is not None:
        return None
    if not job.spec_data.get("datasets") or not job.attempts:
        return None
    phase = staging_phase(attempt_log(rt.files(job.id), LAUNCHER, job.attempts))
    return phase if phase is not None and ": ready in" not in phase else None


def view(
    rt: Runtime | None,
    job: Job,
    *,
    summary_only: bool = False,
    tags: list[str] | None = None,
    values: dict[str, float | str | None] | None = None,
) -> dict[str, Any]:
    """A job as the API shows it (the fields of ``JobOut``); ``summary_only`` (someone else's
    job in a shared list) leaves out its spec (hparams, env), placement, metrics, note and
    stored reason (job-controlled text): name, owner, state, times, project, tags, and a reason
    said by the scheduler or the state. ``tags``: read from the store when not given."""
    data = job.public()
    if tags is None and rt is not None:
        tags = rt.store.runs.tags(job.id)
    data["tags"] = tags or []
    data["values"] = values or {}
    live = rt.scheduler.waiting.get(job.id) if rt is not None else None
    if job.state is JobState.QUEUED and live is not None:
        data["reason"] = live  # the scheduler's words, as of its last tick
    elif (staging := _staging_now(rt, job)) is not None and not summary_only:
        data["reason"] = staging  # "staging digits@2: 41% (120 of 290 MB)": ps shows it
    elif summary_only:
        data["reason"] = state_summary(job)
    if summary_only:
        res = job.spec_data.get("resources")
        data.update(
            spec={"resources": res} if res else {},
            placement=None,
            latest_metrics={},
            note=None,
            hparams=None,
            values={},
        )
    return data


def submit(rt: Runtime, p: Principal, spec: str, workdir: BinaryIO, owner: str) -> Job:
    """A new job from its spec and uploaded workdir archive."""
    job_spec = accepted_spec(rt, p, spec)
    if job_spec.search is not None:
        raise SpecError(
            "the spec has a search: block: submit it as a search (POST /api/v1/searches, or "
            "`trainhouse submit`, which does)"
        )
    digest = store_workdir(rt, workdir, job_spec)
    with rt.store.transaction():
        job = rt.store.jobs.create(
            name=job_spec.name,
            owner=owner_of(p, owner),
            priority=job_spec.priority,
            spec=job_spec,
            archive_sha256=digest,
        )
        audit.record(rt, p, "job.submit", f"job:{job.id}", name=job.name)
    rt.scheduler.wake()
    return job


@dataclass(frozen=True)
class JobPage:
    """A page of jobs as the caller may see them: each job's fields (``view``), how many match,
    and the columns asked for."""

    jobs: list[dict[str, Any]]
    total: int
    columns: list[str]


def page(
    rt: Runtime,
    p: Principal,
    *,
    all: bool = False,
    states: list[JobState] | None = None,
    limit: int = 1000,
    offset: int = 0,
    owner: str | None = None,
    name: str | None = None,
    sort: str = "id",
    order: Literal["asc", "desc"] = "desc",
    where: str | None = None,
    columns: str | None = None,
    project: str | None = None,
    tags: list[str] | None = None,
    archived: Literal["exclude", "include", "only"] = "exclude",
) -> JobPage:
    """A page of jobs (by default the unfinished ones, newest first) and how many match.
    Without the right to see every job (``--job-visibility``), only the caller's own; with the
    right to list them but not read them, filters, sorts and columns on hparams and metrics
    see the caller's own jobs' values only."""
    visibility = rt.settings.job_visibility
    if not p.sees_every_job(visibility):
        if owner is not None and owner != p.name:
            raise Forbidden(f"{p.name!r} may list only their own jobs, not {owner!r}'s")
        owner = p.name
    # each error names what it is about ("where: ...", "columns: ..."): the dashboard shows it
    # under that box
    try:
        fields: list[Field] = parse_fields(columns) if columns else []
    except ValueError as e:
        raise InvalidQuery(f"columns: {e}") from None
    if len(fields) > MAX_COLUMNS:
        raise InvalidQuery(f"columns: at most {MAX_COLUMNS} columns, got {len(fields)}")
    try:
        tree = parse_query(where) if where else None
        sort_field = parse_field(sort)
    except QueryError as e:
        raise InvalidQuery(f"where: {e}") from None
    except ValueError as e:
        raise InvalidQuery(str(e)) from None
    if states is None and not all and tree is None and archived != "only":
        states = [s for s in JobState if not s.terminal]
    private = None if p.is_admin or visibility == "all" or p.is_job else p.name
    found = rt.store.runs.page(
        where=tree,
        columns=fields,
        sort=sort_field,
        order=order,
        limit=limit,
        offset=offset,
        states=states,
        owner=owner,
        name=name,
        project=project,
        tags=tags or (),
        archived={"exclude": False, "include": None, "only": True}[archived],
        private=private,
    )
    return JobPage(
        jobs=[
            view(
                rt,
                j,
                summary_only=not p.may_read(j, visibility),
                tags=found.tags.get(j.id, []),
                values=found.values.get(j.id, {}),
            )
            for j in found.jobs
        ],
        total=found.total,
        columns=[str(f) for f in fields],
    )


@dataclass(frozen=True)
class JobDetail:
    """What ``show JOB`` shows besides the job: attempts, events, checkpoints, clones the
    caller may read, its log ranks, the environment's phase, mlflow params and tags; where its
    files are on the server (admins only)."""

    job: dict[str, Any]
    attempts: list[Attempt]
    events: list[Event]
    checkpoints: int
    clones: list[Job]
    log_ranks: list[int]
    environment: str | None
    job_dir: str | None
    params: dict[str, str]
    mlflow_tags: dict[str, str]
    datasets: list[Pin]
    staging: str | None
    after: list[dict[str, Any]] = field(default_factory=list)  # {job_id, when, state}
    inputs: list[InputPin] = field(default_factory=list)
    promotion: Promotion | None = None


def detail(rt: Runtime, p: Principal, job: Job) -> JobDetail:
    """The job, its attempts and events. Where its files are on the server is for admins (with
    auth off every caller is one), as ``/health`` keeps ``home`` from others."""
    files = rt.files(job.id)
    pins = rt.store.datasets.pins(job.id)
    return JobDetail(
        job=view(rt, job),
        attempts=rt.store.jobs.attempts(job.id),
        events=rt.store.jobs.events(job.id),
        checkpoints=len(rt.store.checkpoints.list(job.id)),
        clones=[
            c for c in rt.store.jobs.clones(job.id) if p.may_read(c, rt.settings.job_visibility)
        ],
        log_ranks=files.ranks(),
        environment=(
            envspec.phase(attempt_log(files, LAUNCHER, job.attempts))
            if job.spec.environment is not None and job.attempts
            else None
        ),
        job_dir=str(files.root) if p.is_admin else None,
        params=rt.store.tracking.values(job.id, "param"),
        mlflow_tags=rt.store.tracking.values(job.id, "tag"),
        datasets=pins,
        staging=(
            staging_phase(attempt_log(files, LAUNCHER, job.attempts))
            if pins and job.attempts
            else None
        ),
        after=_upstreams(rt, p, job),
        inputs=rt.store.flows.inputs(job.id),
        promotion=rt.store.flows.promotion(job.id),
    )


def _upstreams(rt: Runtime, p: Principal, job: Job) -> list[dict[str, Any]]:
    """The jobs ``job`` waits for, with their states (None: deleted, or not the caller's to
    read: waiting on a job is no way to learn its state)."""
    found = rt.store.flows.upstreams([job.id]).get(job.id, [])
    out = []
    for up in found:
        state = up.state
        if state is not None:
            try:
                if not p.may_read(rt.store.jobs.get(up.job), rt.settings.job_visibility):
                    state = None
            except NotFound:
                state = None
        out.append({"job_id": up.job, "when": up.when, "state": state})
    return out


def cancel(rt: Runtime, p: Principal, job: Job) -> Job:
    """Cancel ``job`` (one the caller may write): a queued job ends now, a running one when
    the scheduler loop has stopped its processes (:meth:`JobRepo.cancel`)."""
    if job.state.terminal:
        raise StoreError(f"job {job.id} has already ended ({job.state}); nothing to cancel")
    with rt.store.transaction():
        canceled = rt.store.jobs.cancel(job.id)
        audit.record(rt, p, "job.cancel", f"job:{job.id}", owner=job.owner, name=job.name)
    rt.scheduler.wake()
    return canceled


def metric_series(
    rt: Runtime,
    job: Job,
    *,
    name: str | None = None,
    rank: int | None = None,
    all_ranks: bool = False,
    max_points: int = 0,
    after_step: int | None = None,
) -> list[dict[str, Any]]:
    """The job's series, ordered by name then rank, each with its points by step (at most
    ``max_points`` per series, downsampled on the server; 0: every point)."""
    if 0 < max_points < MIN_DOWNSAMPLED:
        raise InvalidMetrics(
            f"max_points must be 0 (every point) or at least {MIN_DOWNSAMPLED}, got {max_points}"
        )
    found = rt.store.metrics.series(
        job.id, name=name, rank=rank, all_ranks=all_ranks, after_step=after_step
    )
    series = []
    for info in found:
        got = rt.store.metrics.series_points(job.id, info, max_points=max_points)
        series.append(
            {
                "name": got.name,
                "rank": got.rank,
                "points": got.points,
                "total_points": got.total_points,
                "downsampled": got.downsampled,
            }
        )
    return series


def series_names(rt: Runtime, job: Job, *, all_ranks: bool = True) -> list[SeriesInfo]:
    """The job's series (name, rank) with their point counts and last steps, no points."""
    return rt.store.metrics.series(job.id, all_ranks=all_ranks)


def checkpoints(
    rt: Runtime, p: Principal, job: Job, *, include_deleted: bool = False
) -> tuple[str | None, list[Checkpoint]]:
    """The job's checkpoints, oldest first; by default only those a restart may load; and
    their directory (a server path or URL), for admins only."""
    found = rt.store.checkpoints.list(job.id, include_deleted=include_deleted)
    directory = rt.checkpoints.location(job.id) if p.is_admin else None
    return directory, [c for c in found if include_deleted or c.corrupt is None]


def checkpoint(rt: Runtime, job: Job, checkpoint_id: int) -> Checkpoint:
    """One of the job's checkpoints that can still be read."""
    ckpt = rt.store.checkpoints.get(job.id, checkpoint_id)
    if ckpt.deleted:
        raise NotFound(f"checkpoint of step {ckpt.step} was deleted by the retention policy")
    return ckpt


def checkpoint_files(
    rt: Runtime, job: Job, checkpoint_id: int
) -> tuple[Checkpoint, list[tuple[str, int]]]:
    """What a download fetches: one file (name "") or a sharded checkpoint's files, with
    their sizes."""
    ckpt = checkpoint(rt, job, checkpoint_id)
    return ckpt, rt.checkpoints.files(job.id, ckpt)


def checkpoint_bytes(rt: Runtime, job: Job, checkpoint_id: int, file: str) -> Iterator[bytes]:
    """The bytes of a checkpoint file, in chunks."""
    ckpt = checkpoint(rt, job, checkpoint_id)
    return rt.checkpoints.read(job.id, ckpt, file)
