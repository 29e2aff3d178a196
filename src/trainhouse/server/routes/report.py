"""What the SDK inside a job reports: metric batches with a heartbeat, and new checkpoints.

Both need the job's per-attempt credential; a training script can report to its own job only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict

from fastapi import APIRouter, Depends

from trainhouse.server.deps import Services, reporting_job, services
from trainhouse.server.schemas import CheckpointIn, CheckpointOut, CorruptIn, ReportIn, ReportOut
from trainhouse.store import Job, MetricPoint

router = APIRouter(tags=["report"])


@router.post("/jobs/{job_id}/report", response_model=ReportOut)
def report(
    body: ReportIn,
    job: Job = Depends(reporting_job),
    svc: Services = Depends(services),
) -> ReportOut:
    job_id = job.id
    points = [
        MetricPoint(
            step=step,
            name=name,
            value=value if value is not None and math.isfinite(value) else None,
            rank=rank,
            attempt=body.attempt,
            wall_time=wall,
        )
        for step, name, value, rank, wall in body.points
    ]
    accepted = svc.store.add_metrics(
        job_id,
        points,
        batch_id=body.batch_id,
        total_steps=body.total_steps,
        resume=(body.attempt, body.resume_step) if body.resume_step is not None else None,
    )
    stop_reason = None
    limit = job.spec.get("max_runtime")
    if job.cancel_requested:
        stop_reason = "canceled by request"
    elif job.preempt_requested:
        stop_reason = job.reason or "preempted"
    elif limit and time.time() - svc.store.get_attempt(job.id, job.attempts).started_at > limit:
        stop_reason = f"max_runtime exceeded: ran longer than {int(limit)} s"
    return ReportOut(accepted=accepted, stop=stop_reason is not None, stop_reason=stop_reason)


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
    )
    return CheckpointOut(**asdict(ckpt))


@router.post("/jobs/{job_id}/checkpoints/{checkpoint_id}/corrupt", response_model=CheckpointOut)
def report_corrupt(
    checkpoint_id: int,
    body: CorruptIn,
    job: Job = Depends(reporting_job),
    svc: Services = Depends(services),
) -> CheckpointOut:
    """A load found this checkpoint damaged (checksum mismatch, missing files); it is listed
    no more, and kept out of retention so an older good one survives."""
    return CheckpointOut(**asdict(svc.checkpoints.mark_corrupt(job, checkpoint_id, body.reason)))
