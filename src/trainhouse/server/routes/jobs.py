"""Jobs: submit, list, show, cancel, and read their metrics, logs and checkpoints. The work is
:mod:`trainhouse.usecases.jobs`'s; these routes parse, call and render."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from fastapi.responses import Response, StreamingResponse

from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Job
from trainhouse.core.reports import INT64, MAX_NAME, MAX_RANK
from trainhouse.server.auth import caller, readable_job, signed_in, writable_job, writer
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
    InputOut,
    JobDetailOut,
    JobListOut,
    JobOut,
    MetricsOut,
    NulFree,
    PinOut,
    PromotionOut,
    RowId,
    SeriesInfoOut,
    SeriesListOut,
    UpstreamOut,
)
from trainhouse.usecases import jobs
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])

MAX_QUERY = 2000  # characters of a ?where= filter (trainhouse.core.runquery.MAX_QUERY)
MIN_DOWNSAMPLED = jobs.MIN_DOWNSAMPLED


def job_out(
    job: Job,
    rt: Runtime | None = None,
    *,
    summary_only: bool = False,
    tags: list[str] | None = None,
    values: dict[str, float | str | None] | None = None,
) -> JobOut:
    """A job as the API shows it (:func:`trainhouse.usecases.jobs.view`)."""
    return JobOut(**jobs.view(rt, job, summary_only=summary_only, tags=tags, values=values))


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
    return job_out(jobs.submit(rt, p, spec, workdir.file, owner))


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
        description="The field to order by: a job column (" + ", ".join(jobs.JOB_SORT_KEYS) + ", "
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
    found = jobs.page(
        rt,
        p,
        all=all,
        states=state,
        limit=limit,
        offset=offset,
        owner=owner,
        name=name,
        sort=sort,
        order=order,
        where=where,
        columns=columns,
        project=project,
        tags=tag,
        archived=archived,
    )
    return JobListOut(
        jobs=[JobOut(**j) for j in found.jobs], total=found.total, columns=found.columns
    )


@router.get("/jobs/{job_id}", response_model=JobDetailOut)
def show(
    job: Job = Depends(readable_job),
    p: Principal = Depends(caller),
    rt: Runtime = Depends(runtime),
) -> JobDetailOut:
    """The job, its attempts and events. Where its files are on the server is for admins (with
    auth off every caller is one), as ``/health`` keeps ``home`` from others."""
    d = jobs.detail(rt, p, job)
    return JobDetailOut(
        **d.job,
        attempt_history=[
            AttemptOut(**{k: v for k, v in a.public().items() if k in AttemptOut.model_fields})
            for a in d.attempts
        ],
        events=[EventOut(**asdict(e)) for e in d.events],
        checkpoints=d.checkpoints,
        clones=[
            CloneOut(id=c.id, name=c.name, state=c.state, cloned_step=c.cloned_step)
            for c in d.clones
        ],
        log_ranks=d.log_ranks,
        environment=d.environment,
        job_dir=d.job_dir,
        params=d.params,
        mlflow_tags=d.mlflow_tags,
        datasets=[PinOut(**p.to_json(), ref=p.ref) for p in d.datasets],
        staging=d.staging,
        after=[UpstreamOut(**a) for a in d.after],
        inputs=[
            InputOut(key=i.key, ref=i.ref, model=i.model, version=i.version, attempt=i.attempt)
            for i in d.inputs
        ],
        promotion=(
            PromotionOut(
                **{k: v for k, v in asdict(d.promotion).items() if k in PromotionOut.model_fields}
            )
            if d.promotion is not None
            else None
        ),
    )


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel(
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    return job_out(jobs.cancel(rt, p, job), rt)


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
    series = jobs.metric_series(
        rt,
        job,
        name=name,
        rank=rank,
        all_ranks=all_ranks,
        max_points=max_points,
        after_step=after_step,
    )
    # orjson, not a pydantic model: a million points in well under a second
    body = orjson.dumps({"job_id": job.id, "series": series})
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
            for i in jobs.series_names(rt, job, all_ranks=all_ranks)
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
    directory, found = jobs.checkpoints(rt, p, job, include_deleted=all)
    return CheckpointListOut(
        job_id=job.id,
        directory=directory,
        checkpoints=[CheckpointOut(**asdict(c)) for c in found],
    )


@router.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/files", response_model=CheckpointFilesOut)
def checkpoint_files(
    checkpoint_id: RowId, job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)
) -> CheckpointFilesOut:
    """What a download fetches: one file (name "") or a sharded checkpoint's files."""
    ckpt, files = jobs.checkpoint_files(rt, job, checkpoint_id)
    return CheckpointFilesOut(
        checkpoint=CheckpointOut(**asdict(ckpt)),
        files=[CheckpointFileOut(name=n, size=z) for n, z in files],
    )


@router.get("/jobs/{job_id}/checkpoints/{checkpoint_id}/content")
def checkpoint_content(
    checkpoint_id: RowId,
    job: Job = Depends(readable_job),
    file: str = Query("", max_length=1024, description="A sharded checkpoint's file"),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """The bytes of a checkpoint file, streamed."""
    return StreamingResponse(
        jobs.checkpoint_bytes(rt, job, checkpoint_id, file), media_type="application/octet-stream"
    )
