"""What the SDK inside a job reports: metric batches with a heartbeat, and new checkpoints.

Both need the job's per-attempt credential; a training script can report to its own job only.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict

from fastapi import APIRouter, Depends

from trainhouse.errors import CheckpointError
from trainhouse.server.deps import Services, reporting_job, services
from trainhouse.server.schemas import CheckpointIn, CheckpointOut, ReportIn, ReportOut
from trainhouse.spec import CheckpointPolicy
from trainhouse.store import Checkpoint, Job, MetricPoint

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


def retained(checkpoints: list[Checkpoint], policy: CheckpointPolicy) -> set[int]:
    """Ids to keep: the newest ``keep_last`` plus the best ``keep_best`` by the metric."""
    newest = sorted(checkpoints, key=lambda c: (c.step, c.id), reverse=True)
    keep = {c.id for c in newest[: policy.keep_last]}
    if policy.keep_best and policy.metric:
        scored: list[tuple[float, int]] = []
        for c in checkpoints:
            value = c.metrics.get(policy.metric)
            if value is not None and math.isfinite(value):
                scored.append((value if policy.mode == "min" else -value, c.id))
        keep.update(ckpt_id for _, ckpt_id in sorted(scored)[: policy.keep_best])
    return keep


@router.post("/jobs/{job_id}/checkpoints", response_model=CheckpointOut, status_code=201)
def register_checkpoint(
    body: CheckpointIn,
    job: Job = Depends(reporting_job),
    svc: Services = Depends(services),
) -> CheckpointOut:
    job_id = job.id
    files = svc.files(job_id)
    path = files.checkpoint_path(body.path)
    if path is None:
        raise CheckpointError(f"checkpoint path {body.path!r} is outside the job's directory")
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file {body.path!r} does not exist in {files.checkpoints}"
        )
    size = path.stat().st_size
    if size != body.size:
        raise CheckpointError(
            f"checkpoint {body.path!r} is {size} bytes on disk, but {body.size} were reported"
        )
    name = path.relative_to(files.checkpoints.resolve()).as_posix()  # one spelling per file
    # the same file written again (a step redone after a restart) replaces the old record
    svc.store.mark_checkpoints_deleted(
        [c.id for c in svc.store.checkpoints(job_id) if c.path == name]
    )
    ckpt = svc.store.add_checkpoint(
        job_id,
        attempt=body.attempt,
        step=body.step,
        path=name,
        size=body.size,
        sha256=body.sha256,
        metrics=body.metrics,
    )
    policy = CheckpointPolicy.model_validate(job.spec.get("checkpoints") or {})
    live = svc.store.checkpoints(job_id)
    keep = retained(live, policy)
    drop = [c for c in live if c.id not in keep]
    for old in drop:
        old_path = files.checkpoint_path(old.path)
        if old_path is not None:
            for stale in (old_path, old_path.with_name(old_path.name + ".json")):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
    svc.store.mark_checkpoints_deleted([c.id for c in drop])
    return CheckpointOut(**asdict(ckpt))
