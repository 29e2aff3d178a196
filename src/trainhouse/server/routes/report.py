"""What the SDK inside a job reports: metric batches with a heartbeat, and new checkpoints.

Both need the job's per-attempt credential; a training script can report to its own job only.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Request

from trainhouse.scheduler.outcome import stop_reason
from trainhouse.server.auth import reporting_job
from trainhouse.server.deps import Services, services
from trainhouse.server.schemas import (
    CheckpointIn,
    CheckpointOut,
    CorruptIn,
    ReportIn,
    ReportOut,
    RowId,
)
from trainhouse.store import Job
from trainhouse.store.reports import parse_report

router = APIRouter(tags=["report"])

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
def report(
    job: Job = Depends(reporting_job),  # the credential first: a stranger learns no rules
    body: bytes = Depends(raw_body),
    svc: Services = Depends(services),
) -> ReportOut:
    """One flush of the SDK's metric buffer (a ReportIn, up to 200,000 points) and heartbeat;
    the answer says whether the job should stop."""
    parsed = parse_report(body)
    resume = parsed.resume_step
    accepted = svc.store.metrics.add(
        job.id,
        parsed.columns,
        batch_id=parsed.batch_id,
        total_steps=parsed.total_steps,
        resume=(parsed.attempt, resume) if resume is not None else None,
    )
    svc.telemetry.points.inc(accepted)
    started = (
        svc.store.jobs.attempt(job.id, job.attempts).started_at if job.spec.max_runtime else None
    )
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
    svc: Services = Depends(services),
) -> CheckpointOut:
    """A checkpoint the SDK finished writing; retention runs after it in the background."""
    ckpt = svc.checkpoints.register(
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
    svc: Services = Depends(services),
) -> CheckpointOut:
    """A load found this checkpoint damaged (checksum mismatch, missing files); it is listed
    no more, and kept out of retention so an older good one survives."""
    return CheckpointOut(**asdict(svc.checkpoints.mark_corrupt(job, checkpoint_id, body.reason)))
