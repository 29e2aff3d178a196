"""The scheduler's view: the queue in decision order, dry runs, a job's priority, and the users'
limits (fair-share weights and concurrent GPU and CPU caps). Reads ask the scheduler's policy
(:meth:`trainhouse.scheduler.loop.SchedulerLoop.plan`) without side effects; each change is one
transaction with its audit entry, and the scheduler is woken after it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trainhouse.core.errors import NotFound
from trainhouse.core.flows import verdict
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Job, UserLimits
from trainhouse.scheduler.policy import QueuedJob
from trainhouse.scheduler.resources import Demand
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.jobs import state_summary
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import accepted_spec, check_priority, owner_of

__all__ = [
    "DryRun",
    "Queue",
    "Quotas",
    "UserQuota",
    "Waiting",
    "clear_quota",
    "dry_run",
    "queue",
    "quotas",
    "set_priority",
    "set_quota",
]


@dataclass(frozen=True)
class Waiting:
    """A queued job at its place in the decision order (1: considered first), with why it
    waits ("starting now" when the next tick starts it)."""

    position: int
    id: int
    name: str
    owner: str
    priority: str
    created_at: float
    reason: str | None


@dataclass(frozen=True)
class Queue:
    """The queued jobs the caller may see, in decision order, and the running ones asked to
    yield their resources (``id``, ``name``, ``owner``, ``reason``)."""

    jobs: list[Waiting]
    preempting: list[dict[str, Any]]


def queue(rt: Runtime, p: Principal) -> Queue:
    """Waiting jobs in the order the scheduler considers them, each with its reason.
    Without the right to see every job (``--job-visibility``), only the caller's own, at
    their positions in the whole queue; a preempted job's stored reason only to those who may
    read the job (:func:`trainhouse.usecases.jobs.view`'s rule)."""
    decisions = rt.scheduler.plan()
    visibility = rt.settings.job_visibility
    everyone = p.sees_every_job(visibility)
    queued = {
        j.id: j
        for j in rt.store.jobs.list(states=[JobState.QUEUED])
        if everyone or j.owner == p.name
    }
    # the policy's order; then the jobs held for the jobs they wait for (after:), each saying
    # for which
    held = rt.store.flows.upstreams()
    order = [
        *((job_id, decisions.waiting.get(job_id)) for job_id in decisions.order),
        *(
            (job_id, verdict(held[job_id]).reason)
            for job_id in sorted(set(held) - set(decisions.order))
        ),
    ]
    entries = []
    for position, (job_id, reason) in enumerate(order, start=1):
        job = queued.get(job_id)
        if job is None:
            continue
        entries.append(
            Waiting(
                position=position,
                id=job.id,
                name=job.name,
                owner=job.owner,
                priority=job.priority,
                created_at=job.created_at,
                reason=reason or "starting now",
            )
        )
    preempting = [
        {
            "id": j.id,
            "name": j.name,
            "owner": j.owner,
            "reason": j.reason if p.may_read(j, visibility) else state_summary(j),
        }
        for j in rt.store.jobs.list(states=[JobState.RUNNING])
        if (j.preempt_requested or j.resize_requested) and (everyone or j.owner == p.name)
    ]
    return Queue(jobs=entries, preempting=preempting)


@dataclass(frozen=True)
class DryRun:
    """Where a job would run right now (``placement``), or why it would wait and whom it
    would preempt or shrink (elastic jobs); its place in the queue."""

    would_start: bool
    placement: list[dict[str, Any]] | None
    preempts: list[int]
    position: int
    reason: str
    shrinks: list[int] = field(default_factory=list)


def dry_run(rt: Runtime, p: Principal, spec: str, owner: str) -> DryRun:
    """Where a job of ``spec`` (at a priority ``p`` may set, owned as a submit would own it)
    would run right now, or why it would wait; nothing is submitted."""
    job_spec = accepted_spec(rt, p, spec)
    probe = QueuedJob(
        0,
        job_spec.priority,
        time.time(),
        Demand.of(job_spec.resources),
        owner=owner_of(p, owner),
        max_runtime=job_spec.max_runtime,
    )
    decisions = rt.scheduler.plan(probe)
    position = decisions.order.index(0) + 1
    starts = dict(decisions.starts)
    if 0 in starts:
        placement = [pl.to_dict() for pl in starts[0]]
        where = "; ".join(
            f"{pl['node']} ({pl['procs']} rank(s), {pl['cpus']} CPU(s), "
            + (f"GPUs {','.join(str(g) for g in pl['gpus'])})" if pl["gpus"] else "no GPU)")
            for pl in placement
        )
        return DryRun(
            would_start=True,
            placement=placement,
            preempts=[],
            position=position,
            reason=f"would start now on {where}",
        )
    return DryRun(
        would_start=False,
        placement=None,
        preempts=[pr.victim for pr in decisions.preemptions if pr.for_job == 0],
        position=position,
        reason=decisions.waiting[0],
        shrinks=[r.job for r in decisions.resizes if r.for_job == 0],
    )


def set_priority(rt: Runtime, p: Principal, job: Job, priority: str) -> Job:
    """Move ``job`` (one the caller may write) to ``priority`` (above ``normal``: admins
    only)."""
    check_priority(p, priority)
    before = job.priority
    with rt.store.transaction():
        changed = rt.store.jobs.set_priority(job.id, priority)
        audit.record(
            rt, p, "job.priority", f"job:{changed.id}", before=before, after=changed.priority
        )
    rt.scheduler.wake()
    return changed


@dataclass(frozen=True)
class UserQuota:
    """A user's limits (defaults where none are set) and their decayed fair-share usage, in
    cluster-seconds."""

    owner: str
    share: float
    max_gpus: int | None
    max_cpus: int | None
    usage: float


@dataclass(frozen=True)
class Quotas:
    """The default caps, the fair-share half-life, and every user with limits or usage."""

    default_max_gpus: int | None
    default_max_cpus: int | None
    half_life_seconds: float
    users: list[UserQuota]


def quotas(rt: Runtime) -> Quotas:
    """The limits set and the usage of every user who has either, by name."""
    limits = rt.store.quotas.limits()
    usage = rt.scheduler.usage.snapshot()
    cfg = rt.scheduler.config
    return Quotas(
        default_max_gpus=cfg.default_quota.gpus,
        default_max_cpus=cfg.default_quota.cpus,
        half_life_seconds=cfg.half_life,
        users=[
            UserQuota(
                owner=o,
                share=limits[o].share if o in limits else 1.0,
                max_gpus=limits[o].max_gpus if o in limits else None,
                max_cpus=limits[o].max_cpus if o in limits else None,
                usage=usage.get(o, 0.0),
            )
            for o in sorted(set(limits) | set(usage))
        ],
    )


def set_quota(rt: Runtime, p: Principal, owner: str, fields: dict[str, Any]) -> UserQuota:
    """Change ``owner``'s limits (admins only: the route's dependency checks it): the
    ``fields`` given (``share``, ``max_gpus``, ``max_cpus``) replace the current ones, the
    others stay; a ``share`` of None keeps the current weight, a cap of None means the
    default. The audit entry records the fields as given."""
    with rt.store.transaction():
        current = rt.store.quotas.limits().get(owner, UserLimits(owner))
        limits = UserLimits(
            owner,
            share=fields.get("share") or current.share,
            max_gpus=fields.get("max_gpus", current.max_gpus),
            max_cpus=fields.get("max_cpus", current.max_cpus),
        )
        rt.store.quotas.set(limits)
        audit.record(rt, p, "quota.set", owner, **fields)
    rt.scheduler.wake()
    return UserQuota(
        owner=limits.owner,
        share=limits.share,
        max_gpus=limits.max_gpus,
        max_cpus=limits.max_cpus,
        usage=rt.scheduler.usage.snapshot().get(owner, 0.0),
    )


def clear_quota(rt: Runtime, p: Principal, owner: str) -> None:
    """Remove ``owner``'s limits (admins only: the route's dependency checks it); 404 when
    there are none."""
    with rt.store.transaction():
        if not rt.store.quotas.delete(owner):
            raise NotFound(f"user {owner!r} has no limits set")
        audit.record(rt, p, "quota.clear", owner)
    rt.scheduler.wake()
