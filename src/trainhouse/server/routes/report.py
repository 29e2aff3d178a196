"""What the SDK inside a job reports: metric batches with a heartbeat, and new checkpoints.

Both need the job's per-attempt credential; a training script can report to its own job only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, replace
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.reports import parse_report
from trainhouse.core.tokens import hash_token
from trainhouse.ingest.groupcommit import Refused
from trainhouse.scheduler.outcome import stop_reason
from trainhouse.server.auth import AuthHeader, bearer_token, client_address, reporting_job
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    CheckpointIn,
    CheckpointOut,
    CorruptIn,
    ReportIn,
    ReportOut,
    RowId,
)
from trainhouse.store import Job
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["report"])

PARSE_INLINE = 64 * 1024  # bytes: a bigger body is parsed in a thread, not the event loop

# the body is ReportIn, parsed by hand (trainhouse.store.metrics.parse_report): pydantic would
# build and validate a Python object per point, several times slower than storing them
_REPORT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ReportIn.model_json_schema()}},
    }
}


async def raw_body(request: Request) -> bytes:
    return await request.body()


@router.post("/jobs/{job_id}/report", response_model=ReportOut, openapi_extra=_REPORT_BODY)
async def report(
    job_id: RowId,
    request: Request,
    authorization: str | None = AuthHeader,
    body: bytes = Depends(raw_body),
    rt: Runtime = Depends(runtime),
) -> ReportOut:
    """One flush of the SDK's metric buffer (a ReportIn, up to 200,000 points) and heartbeat;
    the answer says whether the job should stop. It comes once the points are committed: with
    many reports at once, in one transaction for many (trainhouse.ingest.groupcommit), which
    checks the job's credential too; 503 with Retry-After when the server has too many points
    queued."""
    token = bearer_token(authorization)
    try:
        if len(body) <= PARSE_INLINE:  # a small body parses faster than a hop to a thread
            parsed = parse_report(body)
        else:
            parsed = await run_in_threadpool(parse_report, body)
    except InvalidMetrics:
        # the credential first: a stranger learns no rules
        await run_in_threadpool(reporting_job, job_id, request, authorization, rt)
        raise
    if token is None or not rt.settings.report_group_commit:
        # no credential (refused as reporting_job refuses it), or one transaction per report
        # in the request's thread as before group commit (bench/load.py's baseline)
        job = await run_in_threadpool(reporting_job, job_id, request, authorization, rt)
        resume = parsed.resume_step
        accepted = await run_in_threadpool(
            rt.store.metrics.add,
            job.id,
            parsed.columns,
            batch_id=parsed.batch_id,
            total_steps=parsed.total_steps,
            resume=(parsed.attempt, resume) if resume is not None else None,
        )
    else:
        try:
            stored = await asyncio.wrap_future(rt.reports.submit(job_id, parsed, hash_token(token)))
        except Refused as refused:
            why = f"the credential is not valid for job {refused.job.id}'s current attempt"
            # counted and audited (a write): in a thread, not on the event loop
            error = await run_in_threadpool(rt.auth.refuse, client_address(request), why, token)
            raise error from None
        job, accepted = stored.job, stored.accepted
    rt.telemetry.points.inc(accepted)
    # a trial: its objective values go to the search's pruner, which may stop it now
    trial = job.search_id is not None and not job.prune_requested and len(parsed.columns) > 0
    if trial and await run_in_threadpool(rt.tune.on_report, job, parsed.columns):
        job = replace(job, prune_requested=True)
    started = None
    if job.spec.max_runtime:
        attempt = await run_in_threadpool(rt.store.jobs.attempt, job.id, job.attempts)
        started = attempt.started_at
    stop = stop_reason(job, started, time.time())
    return ReportOut(
        accepted=accepted,
        stop=stop is not None,
        stop_reason=stop.message if stop is not None else None,
    )


@router.post("/jobs/{job_id}/checkpoints", response_model=CheckpointOut, status_code=201)
def register_checkpoint(
    body: CheckpointIn,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> CheckpointOut:
    """A checkpoint the SDK finished writing; retention runs after it in the background."""
    ckpt = rt.checkpoints.register(
        job,
        attempt=body.attempt,
        step=body.step,
        path=body.path,
        size=body.size,
        sha256=body.sha256,
        metrics=body.metrics,
        kind=body.kind,
        algorithm=body.algorithm,
    )
    return CheckpointOut(**asdict(ckpt))


@router.post("/jobs/{job_id}/checkpoints/{checkpoint_id}/corrupt", response_model=CheckpointOut)
def report_corrupt(
    checkpoint_id: RowId,
    body: CorruptIn,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> CheckpointOut:
    """A load found this checkpoint damaged (checksum mismatch, missing files); it is listed
    no more, and kept out of retention so an older good one survives."""
    return CheckpointOut(**asdict(rt.checkpoints.mark_corrupt(job, checkpoint_id, body.reason)))
