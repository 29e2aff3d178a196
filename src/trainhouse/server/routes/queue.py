"""The scheduler's view: the queue in decision order, dry runs, priorities and user limits.
The work is :mod:`trainhouse.usecases.queue`'s; these routes parse, call and render."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Path
from pydantic import BaseModel, Field

from trainhouse.core.records import Job
from trainhouse.core.spec import Priority
from trainhouse.server.auth import admin, signed_in, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import job_out
from trainhouse.server.schemas import INT32, NO_NUL, JobOut
from trainhouse.usecases import queue as uc
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["scheduler"])

Owner = Annotated[str, Path(max_length=128, pattern=NO_NUL)]  # as stored: at most 128


class QueueEntry(BaseModel):
    position: int
    id: int
    name: str
    owner: str
    priority: str
    created_at: float
    reason: str | None


class QueueOut(BaseModel):
    jobs: list[QueueEntry]
    preempting: list[dict[str, Any]] = Field(
        default_factory=list, description="Running jobs asked to yield, and for whom"
    )


@router.get("/queue", response_model=QueueOut)
def queue(p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> QueueOut:
    """Waiting jobs in the order the scheduler considers them, each with its reason.
    Without the right to see every job (``--job-visibility``), only the caller's own, at
    their positions in the whole queue."""
    found = uc.queue(rt, p)
    return QueueOut(jobs=[QueueEntry(**asdict(w)) for w in found.jobs], preempting=found.preempting)


class DryRunOut(BaseModel):
    would_start: bool
    placement: list[dict[str, Any]] | None
    preempts: list[int]
    position: int
    reason: str
    shrinks: list[int] = Field(
        default_factory=list, description="Elastic jobs it would shrink (at a checkpoint)"
    )


@router.post("/jobs/dry-run", response_model=DryRunOut)
def dry_run(
    spec: Annotated[str, Form(description="The job spec as YAML or JSON")],
    owner: Annotated[
        str, Form(max_length=128, description="Ignored when auth is on: the token's user")
    ] = "anonymous",
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> DryRunOut:
    """Where a job would run right now, or why it would wait; nothing is submitted."""
    return DryRunOut(**asdict(uc.dry_run(rt, p, spec, owner)))


class PriorityIn(BaseModel):
    priority: Priority


@router.post("/jobs/{job_id}/priority", response_model=JobOut)
def set_priority(
    body: PriorityIn,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    return job_out(uc.set_priority(rt, p, job, body.priority), rt)


class LimitsIn(BaseModel):
    share: float | None = Field(None, gt=0, le=1e6, description="Fair-share weight (default 1)")
    max_gpus: int | None = Field(
        None, ge=0, le=INT32, description="Concurrent GPU cap; null = default"
    )
    max_cpus: int | None = Field(None, ge=0, le=INT32, description="Concurrent CPU-core cap")


class LimitsOut(BaseModel):
    owner: str
    share: float
    max_gpus: int | None
    max_cpus: int | None
    usage: float = Field(description="Decayed fair-share usage, in cluster-seconds")


class QuotasOut(BaseModel):
    default_max_gpus: int | None
    default_max_cpus: int | None
    half_life_seconds: float
    users: list[LimitsOut]


@router.get("/quotas", response_model=QuotasOut)
def quotas(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> QuotasOut:
    found = uc.quotas(rt)
    return QuotasOut(
        default_max_gpus=found.default_max_gpus,
        default_max_cpus=found.default_max_cpus,
        half_life_seconds=found.half_life_seconds,
        users=[LimitsOut(**asdict(u)) for u in found.users],
    )


@router.put("/quotas/{owner}", response_model=LimitsOut)
def set_quota(
    owner: Owner,
    body: LimitsIn,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> LimitsOut:
    return LimitsOut(**asdict(uc.set_quota(rt, p, owner, body.model_dump(exclude_unset=True))))


@router.delete("/quotas/{owner}", status_code=204)
def clear_quota(
    owner: Owner,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> None:
    uc.clear_quota(rt, p, owner)
