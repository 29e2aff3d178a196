"""The scheduler's view: the queue in decision order, dry runs, priorities and user limits."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Path, Request
from pydantic import BaseModel, Field

from trainhouse.core.errors import NotFound
from trainhouse.core.lifecycle import JobState
from trainhouse.core.spec import Priority
from trainhouse.scheduler.policy import QueuedJob
from trainhouse.scheduler.resources import Demand
from trainhouse.server.auth import admin, audit, signed_in, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import (
    check_priority,
    job_out,
    owner_of,
    schedulable_spec,
    state_summary,
)
from trainhouse.server.schemas import INT32, NO_NUL, JobOut
from trainhouse.store import Job, UserLimits
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
    decisions = rt.scheduler.plan()
    everyone = p.sees_every_job(rt.settings.job_visibility)
    jobs = {
        j.id: j
        for j in rt.store.jobs.list(states=[JobState.QUEUED])
        if everyone or j.owner == p.name
    }
    entries = []
    for position, job_id in enumerate(decisions.order, start=1):
        job = jobs.get(job_id)
        if job is None:
            continue
        reason = decisions.waiting.get(job_id) or "starting now"
        entries.append(
            QueueEntry(
                position=position,
                id=job.id,
                name=job.name,
                owner=job.owner,
                priority=job.priority,
                created_at=job.created_at,
                reason=reason,
            )
        )
    visibility = rt.settings.job_visibility
    preempting = [
        {
            "id": j.id,
            "name": j.name,
            "owner": j.owner,
            # the stored reason only to those who may read the job (job_out's rule)
            "reason": j.reason if p.may_read(j, visibility) else state_summary(j),
        }
        for j in rt.store.jobs.list(states=[JobState.RUNNING])
        if j.preempt_requested and (everyone or j.owner == p.name)
    ]
    return QueueOut(jobs=entries, preempting=preempting)


class DryRunOut(BaseModel):
    would_start: bool
    placement: list[dict[str, Any]] | None
    preempts: list[int]
    position: int
    reason: str


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
    job_spec = schedulable_spec(spec, rt)
    check_priority(p, job_spec.priority)
    owner = owner_of(p, owner)
    probe = QueuedJob(
        0,
        job_spec.priority,
        time.time(),
        Demand.of(job_spec.resources),
        owner=owner,
        max_runtime=job_spec.max_runtime,
    )
    decisions = rt.scheduler.plan(probe)
    position = decisions.order.index(0) + 1
    starts = dict(decisions.starts)
    if 0 in starts:
        placement = [p.to_dict() for p in starts[0]]
        where = "; ".join(
            f"{p['node']} ({p['procs']} rank(s), {p['cpus']} CPU(s), "
            + (f"GPUs {','.join(str(g) for g in p['gpus'])})" if p["gpus"] else "no GPU)")
            for p in placement
        )
        return DryRunOut(
            would_start=True,
            placement=placement,
            preempts=[],
            position=position,
            reason=f"would start now on {where}",
        )
    preempts = [p.victim for p in decisions.preemptions if p.for_job == 0]
    return DryRunOut(
        would_start=False,
        placement=None,
        preempts=preempts,
        position=position,
        reason=decisions.waiting[0],
    )


class PriorityIn(BaseModel):
    priority: Priority


@router.post("/jobs/{job_id}/priority", response_model=JobOut)
def set_priority(
    request: Request,
    body: PriorityIn,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    check_priority(p, body.priority)
    before = job.priority
    job = rt.store.jobs.set_priority(job.id, body.priority)
    audit(rt, request, p, "job.priority", f"job:{job.id}", before=before, after=job.priority)
    rt.scheduler.wake()
    return job_out(job, rt)


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
    limits = rt.store.quotas.limits()
    usage = rt.scheduler.usage.snapshot()
    owners = sorted(set(limits) | set(usage))
    cfg = rt.scheduler.config
    return QuotasOut(
        default_max_gpus=cfg.default_quota.gpus,
        default_max_cpus=cfg.default_quota.cpus,
        half_life_seconds=cfg.half_life,
        users=[
            LimitsOut(
                owner=o,
                share=limits[o].share if o in limits else 1.0,
                max_gpus=limits[o].max_gpus if o in limits else None,
                max_cpus=limits[o].max_cpus if o in limits else None,
                usage=usage.get(o, 0.0),
            )
            for o in owners
        ],
    )


@router.put("/quotas/{owner}", response_model=LimitsOut)
def set_quota(
    request: Request,
    owner: Owner,
    body: LimitsIn,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> LimitsOut:
    current = rt.store.quotas.limits().get(owner, UserLimits(owner))
    fields = body.model_dump(exclude_unset=True)
    limits = UserLimits(
        owner,
        share=fields.get("share") or current.share,
        max_gpus=fields.get("max_gpus", current.max_gpus),
        max_cpus=fields.get("max_cpus", current.max_cpus),
    )
    rt.store.quotas.set(limits)
    audit(rt, request, p, "quota.set", owner, **body.model_dump(exclude_unset=True))
    rt.scheduler.wake()
    return LimitsOut(**limits.__dict__, usage=rt.scheduler.usage.snapshot().get(owner, 0.0))


@router.delete("/quotas/{owner}", status_code=204)
def clear_quota(
    request: Request,
    owner: Owner,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> None:
    if not rt.store.quotas.delete(owner):
        raise NotFound(f"user {owner!r} has no limits set")
    audit(rt, request, p, "quota.clear", owner)
    rt.scheduler.wake()
