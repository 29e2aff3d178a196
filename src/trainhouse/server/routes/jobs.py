"""Jobs: submit, list, show, cancel, and read their metrics, logs and checkpoints."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse

from trainhouse.core import envspec
from trainhouse.core.errors import (
    ArchiveError,
    Forbidden,
    InvalidMetrics,
    InvalidQuery,
    NotFound,
    ResourceError,
    SpecError,
    StoreError,
    UploadTooLarge,
)
from trainhouse.core.lifecycle import JobState, StopReason
from trainhouse.core.reports import INT64, MAX_NAME, MAX_RANK
from trainhouse.core.runquery import QueryError, parse_field, parse_fields
from trainhouse.core.runquery import parse as parse_query
from trainhouse.core.spec import PRIORITY_TIERS, JobSpec, parse_spec
from trainhouse.jobfs.layout import LAUNCHER
from trainhouse.jobfs.workdir import human_size, list_members
from trainhouse.scheduler.failures import attempt_log
from trainhouse.scheduler.resources import never_fits
from trainhouse.server.auth import audit, caller, readable_job, signed_in, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    NO_NUL,
    AttemptOut,
    CheckpointFileOut,
    CheckpointFilesOut,
    CheckpointListOut,
    CheckpointOut,
    CloneOut,
    EventOut,
    JobDetailOut,
    JobListOut,
    JobOut,
    MetricsOut,
    NulFree,
    RowId,
    SeriesInfoOut,
    SeriesListOut,
)
from trainhouse.store import Job
from trainhouse.store.jobs import JOB_SORT_KEYS
from trainhouse.store.series import MIN_DOWNSAMPLED
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])

MAX_COLUMNS = 50  # columns of one runs-table page
MAX_QUERY = 2000  # characters of a ?where= filter (trainhouse.core.runquery.MAX_QUERY)


def state_summary(job: Job) -> str:
    """Where ``job`` stands, said from its state and counters alone: what someone who may not
    read the job sees instead of its reason, which may quote its log (a failed job's last
    lines, the line a ``no_restart_on`` pattern matched)."""
    state = job.state
    if state is JobState.RUNNING:
        return f"running attempt {job.attempts}" + (
            "; asked to yield its resources" if job.preempt_requested else ""
        )
    if state is JobState.FAILED and job.exit_code is not None:
        return f"failed with exit code {job.exit_code}"
    return state.lower()


def job_out(
    job: Job,
    rt: Runtime | None = None,
    *,
    summary_only: bool = False,
    tags: list[str] | None = None,
    values: dict[str, float | str | None] | None = None,
) -> JobOut:
    """A job as the API shows it; ``summary_only`` (someone else's job in a shared list)
    leaves out its spec (hparams, env), placement, metrics, note and stored reason
    (job-controlled text): name, owner, state, times, project, tags, and a reason said by the
    scheduler or the state. ``tags``: read from the store when not given."""
    data = job.public()
    if tags is None and rt is not None:
        tags = rt.store.runs.tags(job.id)
    data["tags"] = tags or []
    data["values"] = values or {}
    live = rt.scheduler.waiting.get(job.id) if rt is not None else None
    if job.state is JobState.QUEUED and live is not None:
        data["reason"] = live  # the scheduler's words, as of its last tick
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
    return JobOut(**data)


def schedulable_spec(
    text: str, rt: Runtime, *, overrides: list[str] | None = None, source: str = "spec"
) -> JobSpec:
    """Parse a submitted spec (with ``--set`` overrides) and refuse a job that could never
    run on this server."""
    job_spec = parse_spec(text, source=source, overrides=overrides)
    executor = rt.scheduler.executor
    # the inventory, busy or not (nodes() is what is free right now)
    reason = never_fits(executor.capacity(), job_spec.resources, multi_node=executor.multi_node)
    if reason is None and job_spec.resources.nodes > 1 and not rt.settings.shared_checkpoints:
        reason = (
            f"resources.nodes is {job_spec.resources.nodes}, but checkpoints are stored on the "
            "server's own disk (HOME/jobs/<id>/checkpoints), which the other nodes do not "
            "reach; start the server with --checkpoint-url (a directory every node mounts, or "
            "an fsspec URL such as s3://bucket/prefix), or with --shared-home if every node "
            "mounts HOME at the same path"
        )
    if reason:
        raise ResourceError(f"job can never run on this server: {reason}")
    return job_spec


def store_workdir(rt: Runtime, workdir: UploadFile, job_spec: JobSpec) -> str:
    """Keep the uploaded workdir archive (bounded, checked to hold the entrypoint's file);
    its digest."""

    def validate(archive: Path) -> None:
        check_entrypoint(job_spec, archive)

    try:
        digest, _size = rt.blobs.put(workdir.file, rt.settings.max_upload_bytes, validate)
    except ValueError:
        raise UploadTooLarge(
            f"workdir archive is larger than {human_size(rt.settings.max_upload_bytes)}"
        ) from None
    return digest


def check_priority(p: Principal, priority: str) -> None:
    """Only admins raise a job above ``normal`` (with auth off, everyone is an admin)."""
    if not p.is_admin and PRIORITY_TIERS.index(priority) > PRIORITY_TIERS.index("normal"):
        raise Forbidden(
            f"priority {priority!r} is above 'normal': only admins may set it "
            f"(user {p.name!r} is a {p.role})"
        )


def check_entrypoint(job_spec: JobSpec, archive: Path) -> None:
    """Refuse a workdir archive that lacks the spec's entrypoint script."""
    names = list_members(archive)
    script = job_spec.script_path()
    if script is not None:
        wanted = script.removeprefix("./")
        if wanted not in names:
            shown = ", ".join(sorted(names)[:10]) or "no files"
            raise ArchiveError(
                f"entrypoint file {wanted!r} is not in the uploaded workdir "
                f"(it holds {len(names)} files: {shown})"
            )


def owner_of(p: Principal, claimed: str) -> str:
    """Who owns what ``p`` submits: the token's user; with auth off, the name sent."""
    return p.name if p.authenticated else (claimed or "anonymous")


@router.post("/jobs", response_model=JobOut, status_code=201)
def submit(
    spec: Annotated[str, Form(description="The job spec as YAML or JSON")],
    workdir: Annotated[UploadFile, File(description="The workdir as a .tar.gz archive")],
    owner: Annotated[
        str,
        Form(
            max_length=128,
            pattern=NO_NUL,
            description="Ignored when auth is on: the token's user owns it",
        ),
    ] = "anonymous",
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    job_spec = schedulable_spec(spec, rt)
    if job_spec.search is not None:
        raise SpecError(
            "the spec has a search: block: submit it as a search (POST /api/v1/searches, or "
            "`trainhouse submit`, which does)"
        )
    check_priority(p, job_spec.priority)
    digest = store_workdir(rt, workdir, job_spec)
    job = rt.store.jobs.create(
        name=job_spec.name,
        owner=owner_of(p, owner),
        priority=job_spec.priority,
        spec=job_spec,
        archive_sha256=digest,
    )
    rt.scheduler.wake()
    return job_out(job)


@router.get("/jobs", response_model=JobListOut)
def list_jobs(
    all: bool = Query(False, description="Include ended jobs"),
    state: list[JobState] | None = Query(None),
    limit: int = Query(1000, ge=1, le=10000),
    offset: int = Query(0, ge=0, le=INT64, description="Skip this many jobs (pagination)"),
    owner: str | None = Query(
        None, max_length=128, pattern=NO_NUL, description="Only this owner's jobs"
    ),
    name: str | None = Query(
        None,
        max_length=128,
        pattern=NO_NUL,
        description="Only jobs whose name contains this (any case)",
    ),
    sort: str = Query(
        "id",
        max_length=300,
        pattern=NO_NUL,
        description="The field to order by: a job column (" + ", ".join(JOB_SORT_KEYS) + ", "
        "...), hparams.<key> or metrics.<series>.<last|min|max>; jobs without it last, ties by id",
    ),
    order: Literal["asc", "desc"] = Query("desc"),
    where: str | None = Query(
        None,
        max_length=MAX_QUERY,
        pattern=NO_NUL,
        description="A filter such as `metrics.val_loss.min < 0.1 and hparams.lr >= 1e-3 and "
        "state = COMPLETED` (trainhouse.core.runquery); with it, ended jobs are listed too",
    ),
    columns: str | None = Query(
        None,
        max_length=4000,
        pattern=NO_NUL,
        description="Comma-separated fields whose values each job carries in `values`",
    ),
    project: str | None = Query(None, max_length=128, pattern=NO_NUL),
    tag: list[NulFree] | None = Query(None, description="Only jobs with every one of these tags"),
    archived: Literal["exclude", "include", "only"] = Query(
        "exclude",
        description="Archived jobs (all ended): left out (the default), listed too, or only "
        "them (ended jobs are listed then without all=true)",
    ),
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> JobListOut:
    """A page of jobs (by default the unfinished ones, newest first) and how many match.
    Without the right to see every job (``--job-visibility``), only the caller's own; with the
    right to list them but not read them, filters, sorts and columns on hparams and metrics
    see the caller's own jobs' values only."""
    visibility = rt.settings.job_visibility
    if not p.sees_every_job(visibility):
        if owner is not None and owner != p.name:
            raise Forbidden(f"{p.name!r} may list only their own jobs, not {owner!r}'s")
        owner = p.name
    try:
        tree = parse_query(where) if where else None
        fields = parse_fields(columns) if columns else []
        sort_field = parse_field(sort)
    except QueryError as e:
        raise InvalidQuery(f"where: {e}") from None
    except ValueError as e:
        raise InvalidQuery(str(e)) from None
    if len(fields) > MAX_COLUMNS:
        raise InvalidQuery(f"at most {MAX_COLUMNS} columns, got {len(fields)}")
    states: list[JobState] | None = state
    if states is None and not all and tree is None and archived != "only":
        states = [s for s in JobState if not s.terminal]
    private = None if p.is_admin or visibility == "all" or p.is_job else p.name
    page = rt.store.runs.page(
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
        tags=tag or (),
        archived={"exclude": False, "include": None, "only": True}[archived],
        private=private,
    )
    return JobListOut(
        jobs=[
            job_out(
                j,
                rt,
                summary_only=not p.may_read(j, visibility),
                tags=page.tags.get(j.id, []),
                values=page.values.get(j.id, {}),
            )
            for j in page.jobs
        ],
        total=page.total,
        columns=[str(f) for f in fields],
    )


@router.get("/jobs/{job_id}", response_model=JobDetailOut)
def show(
    job: Job = Depends(readable_job),
    p: Principal = Depends(caller),
    rt: Runtime = Depends(runtime),
) -> JobDetailOut:
    """The job, its attempts and events. Where its files are on the server is for admins (with
    auth off every caller is one), as ``/health`` keeps ``home`` from others."""
    job_id = job.id
    files = rt.files(job_id)
    return JobDetailOut(
        **job_out(job, rt).model_dump(),
        attempt_history=[
            AttemptOut(**{k: v for k, v in a.public().items() if k in AttemptOut.model_fields})
            for a in rt.store.jobs.attempts(job_id)
        ],
        events=[EventOut(**asdict(e)) for e in rt.store.jobs.events(job_id)],
        checkpoints=len(rt.store.checkpoints.list(job_id)),
        clones=[
            CloneOut(id=c.id, name=c.name, state=c.state, cloned_step=c.cloned_step)
            for c in rt.store.jobs.clones(job_id)
            if p.may_read(c, rt.settings.job_visibility)
        ],
        log_ranks=files.ranks(),
        environment=(
            envspec.phase(attempt_log(files, LAUNCHER, job.attempts))
            if job.spec.environment is not None and job.attempts
            else None
        ),
        job_dir=str(files.root) if p.is_admin else None,
        params=rt.store.tracking.values(job_id, "param"),
        mlflow_tags=rt.store.tracking.values(job_id, "tag"),
    )


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel(
    request: Request,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    job_id = job.id
    if job.state.terminal:
        raise StoreError(f"job {job_id} has already ended ({job.state}); nothing to cancel")
    rt.store.jobs.request_cancel(job_id)
    audit(rt, request, p, "job.cancel", f"job:{job_id}", owner=job.owner, name=job.name)
    # a queued job ends here; in any other state the scheduler loop ends it (and if it
    # started meanwhile, the compare-and-set refuses and the loop stops its processes); a
    # tracked run (an MLflow run made outside a job) has no processes: it ends here too
    ends_here = [JobState.QUEUED, JobState.RUNNING] if job.tracked else [JobState.QUEUED]
    with contextlib.suppress(StoreError):
        rt.store.jobs.transition(
            job_id, JobState.CANCELED, reason=StopReason.CANCEL.text, expect=ends_here
        )
    rt.scheduler.wake()
    return job_out(rt.store.jobs.get(job_id))


@router.get("/jobs/{job_id}/metrics", response_model=MetricsOut)
def metrics(
    job: Job = Depends(readable_job),
    name: str | None = Query(
        None, max_length=MAX_NAME, pattern=NO_NUL, description="Only this metric"
    ),
    rank: int | None = Query(
        None, ge=0, le=MAX_RANK, description="A rank's own values (all_ranks=True)"
    ),
    all_ranks: bool = Query(False, description="Every rank's values as well as the job's"),
    max_points: int = Query(
        0,
        ge=0,
        le=100_000,
        description="At most this many points per series (0: every point). A longer series "
        "is downsampled on the server: its first and last points and, per step bucket, the "
        f"points with the smallest and the largest value; at least {MIN_DOWNSAMPLED}",
    ),
    after_step: int | None = Query(
        None, ge=-1, le=INT64, description="Only points past this step (live polling)"
    ),
    rt: Runtime = Depends(runtime),
) -> Response:
    """The job's series, ordered by name then rank, each with its points by step."""
    job_id = job.id
    if 0 < max_points < MIN_DOWNSAMPLED:
        raise InvalidMetrics(
            f"max_points must be 0 (every point) or at least {MIN_DOWNSAMPLED}, got {max_points}"
        )
    found = rt.store.metrics.series(
        job_id, name=name, rank=rank, all_ranks=all_ranks, after_step=after_step
    )
    series = []
    for info in found:
        got = rt.store.metrics.series_points(job_id, info, max_points=max_points)
        series.append(
            {
                "name": got.name,
                "rank": got.rank,
                "points": got.points,
                "total_points": got.total_points,
                "downsampled": got.downsampled,
            }
        )
    # orjson, not a pydantic model: a million points in well under a second
    body = orjson.dumps({"job_id": job_id, "series": series})
    return Response(body, media_type="application/json")


@router.get("/jobs/{job_id}/metrics/names", response_model=SeriesListOut)
def metric_names(
    job: Job = Depends(readable_job),
    all_ranks: bool = Query(True, description="Per-rank series too (all_ranks=True)"),
    rt: Runtime = Depends(runtime),
) -> SeriesListOut:
    """The job's series (name, rank) with their point counts and last steps, no points."""
    return SeriesListOut(
        job_id=job.id,
        series=[
            SeriesInfoOut(name=i.name, rank=i.rank, points=i.points, last_step=i.last_step)
            for i in rt.store.metrics.series(job.id, all_ranks=all_ranks)
        ],
    )


@router.get("/jobs/{job_id}/checkpoints", response_model=CheckpointListOut)
def checkpoints(
    job: Job = Depends(readable_job),
    all: bool = Query(False, description="Include deleted and corrupt ones"),
    p: Principal = Depends(caller),
    rt: Runtime = Depends(runtime),
) -> CheckpointListOut:
    """The job's checkpoints, oldest first; by default only those a restart may load. Their
    directory (a server path or URL) is for admins."""
    job_id = job.id
    found = rt.store.checkpoints.list(job_id, include_deleted=all)
    return CheckpointListOut(
        job_id=job_id,
        directory=rt.checkpoints.location(job_id) if p.is_admin else None,
        checkpoints=[CheckpointOut(**asdict(c)) for c in found if all or c.corrupt is None],
    )


@router.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/files", response_model=CheckpointFilesOut)
def checkpoint_files(
    checkpoint_id: RowId, job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)
) -> CheckpointFilesOut:
    """What a download fetches: one file (name "") or a sharded checkpoint's files."""
    job_id = job.id
    ckpt = rt.store.checkpoints.get(job_id, checkpoint_id)
    if ckpt.deleted:
        raise NotFound(f"checkpoint of step {ckpt.step} was deleted by the retention policy")
    return CheckpointFilesOut(
        checkpoint=CheckpointOut(**asdict(ckpt)),
        files=[CheckpointFileOut(name=n, size=z) for n, z in rt.checkpoints.files(job_id, ckpt)],
    )


@router.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/content")
def checkpoint_content(
    checkpoint_id: RowId,
    job: Job = Depends(readable_job),
    file: str = Query("", max_length=1024, description="A sharded checkpoint's file"),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """The bytes of a checkpoint file, streamed."""
    job_id = job.id
    ckpt = rt.store.checkpoints.get(job_id, checkpoint_id)
    if ckpt.deleted:
        raise NotFound(f"checkpoint of step {ckpt.step} was deleted by the retention policy")
    return StreamingResponse(
        rt.checkpoints.read(job_id, ckpt, file), media_type="application/octet-stream"
    )
