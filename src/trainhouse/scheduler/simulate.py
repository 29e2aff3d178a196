"""A discrete-event simulation of a cluster driven by the real policy.

Used by the property tests (starvation, fair share, preemption) and by ``bench/scheduler.py``
(decision time and utilisation against FIFO without backfill). Time jumps from event to event:
an arrival, a job's end, a preempted job's stop. A preempted job loses the work since its last
checkpoint and goes back to the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainhouse.core.cluster import Node, Placement
from trainhouse.scheduler.fairshare import DEFAULT_ENTRY_SECONDS, DEFAULT_HALF_LIFE, UsageLedger
from trainhouse.scheduler.policy import (
    Decisions,
    QueuedJob,
    RunningJob,
    Snapshot,
    cluster_totals,
    cost_rate,
    decide,
    free_capacity,
)
from trainhouse.scheduler.resources import Demand, place


@dataclass
class SimJob:
    id: int
    owner: str
    priority: str
    submit_at: float
    demand: Demand
    runtime: float  # seconds of work it needs
    max_runtime: float | None = None  # what it declares (for backfill)
    checkpoint_every: float = 600.0


@dataclass
class SimResult:
    makespan: float
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # per owner, work done
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)  # job id -> end time
    started: dict[int, float] = field(default_factory=dict)  # job id -> first start
    preemptions: list[tuple[int, int]] = field(default_factory=list)  # (victim, for job)
    lost_seconds: float = 0.0
    decision_seconds: list[float] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)
    # (start, end, GPUs) of every stretch a job held GPUs, preempted stretches included
    segments: list[tuple[float, float, int]] = field(default_factory=list)
    # the first time a decision left a job waiting (the queue first stayed non-empty)
    first_wait: float | None = None

    def utilisation(self, total_gpus: int, until: float | None = None) -> float:
        span = until or self.makespan
        return sum(self.gpu_seconds.values()) / (total_gpus * span) if span else 0.0

    def utilisation_between(self, start: float, end: float, total_gpus: int) -> float:
        """GPU-seconds held within [start, end] / (GPUs x (end - start))."""
        if end <= start or not total_gpus:
            return 0.0
        held = sum(g * max(min(b, end) - max(a, start), 0.0) for a, b, g in self.segments)
        return held / (total_gpus * (end - start))


def fifo_decide(snapshot: Snapshot) -> Decisions:
    """The baseline: submission order, head of line blocks, no backfill, no preemption."""
    free = free_capacity(snapshot.nodes, snapshot.running)
    out = Decisions()
    for job in sorted(snapshot.queued, key=lambda j: (j.created_at, j.id)):
        nodes = place(free, job.demand)
        if nodes is None:
            for rest in snapshot.queued:
                if rest.id not in dict(out.starts):
                    out.waiting[rest.id] = "blocked"
            break
        out.starts.append((job.id, tuple(f.take(job.demand) for f in nodes)))
    return out


@dataclass
class _Run:
    job: SimJob
    placements: tuple[Placement, ...]
    started: float
    remaining_at_start: float


def simulate(
    nodes: Sequence[Node],
    jobs: Sequence[SimJob],
    *,
    policy: Callable[[Snapshot], Decisions] = decide,
    until: float | None = None,
    half_life: float = DEFAULT_HALF_LIFE,
    entry_seconds: float = DEFAULT_ENTRY_SECONDS,
    max_events: int = 1_000_000,
) -> SimResult:
    nodes = tuple(nodes)
    total_gpus, total_cpus = cluster_totals(nodes)
    pending = sorted(jobs, key=lambda j: (j.submit_at, j.id))
    by_id = {j.id: j for j in jobs}
    remaining = {j.id: j.runtime for j in jobs}
    # id -> what the policy sees of it (queued since: its fair-share age); built when the job
    # enters the queue, so that an incremental policy recognises the unchanged queue
    queued: dict[int, QueuedJob] = {}
    running: dict[int, _Run] = {}
    ledger = UsageLedger(at=0.0, half_life=half_life, entry_seconds=entry_seconds)
    result = SimResult(makespan=0.0)
    now = 0.0
    arrival = 0
    for _ in range(max_events):
        while arrival < len(pending) and pending[arrival].submit_at <= now:
            queued[pending[arrival].id] = _queued(pending[arrival], pending[arrival].submit_at)
            arrival += 1
        # finish what is done
        for job_id, run in list(running.items()):
            if run.started + run.remaining_at_start <= now + 1e-9:
                _account(result, run, now)
                del running[job_id]
                remaining[job_id] = 0.0
                result.finished[job_id] = now
        ledger.advance(
            now,
            [
                (r.job.owner, cost_rate(r.job.demand, total_gpus, total_cpus))
                for r in running.values()
            ],
        )
        if queued:
            snap = Snapshot(
                nodes,
                tuple(
                    RunningJob(
                        r.job.id,
                        r.placements,
                        r.job.owner,
                        r.job.priority,
                        r.started,
                        r.job.max_runtime,
                        r.started
                        + ((now - r.started) // r.job.checkpoint_every) * r.job.checkpoint_every,
                    )
                    for r in running.values()
                ),
                tuple(queued.values()),
                now=now,
                usage=ledger.snapshot(),
            )
            t0 = time.perf_counter()
            decisions = policy(snap)
            result.decision_seconds.append(time.perf_counter() - t0)
            for pre in decisions.preemptions:
                run = running.pop(pre.victim)
                done = now - run.started
                since_ckpt = done % run.job.checkpoint_every
                kept = done - since_ckpt
                _account(result, run, now)
                result.lost_seconds += since_ckpt
                remaining[pre.victim] = run.remaining_at_start - kept
                queued[pre.victim] = _queued(run.job, now)
                result.preemptions.append((pre.victim, pre.for_job))
            for job_id, placements in decisions.starts:
                job = by_id[job_id]
                running[job_id] = _Run(job, placements, now, remaining[job_id])
                result.started.setdefault(job_id, now)
                del queued[job_id]
                ledger.charge_start(job.owner, cost_rate(job.demand, total_gpus, total_cpus))
            if queued and result.first_wait is None:
                result.first_wait = now
            if decisions.preemptions:
                continue  # the freed room is handed out at the same instant
        nxt = [r.started + r.remaining_at_start for r in running.values()]
        if arrival < len(pending):
            nxt.append(pending[arrival].submit_at)
        if not nxt or (until is not None and min(nxt) > until):
            break
        now = max(min(nxt), now)
    end = until if until is not None else now
    for run in running.values():
        _account(result, run, end)
    result.makespan = end
    result.unfinished = sorted(j for j in by_id if j not in result.finished)
    return result


def _queued(job: SimJob, since: float) -> QueuedJob:
    return QueuedJob(job.id, job.priority, since, job.demand, job.owner, job.max_runtime)


def _account(result: SimResult, run: _Run, now: float) -> None:
    seconds = max(now - run.started, 0.0)
    gpus = sum(len(p.gpus) for p in run.placements)
    result.segments.append((run.started, run.started + seconds, gpus))
    cpus = sum(p.cpus for p in run.placements)
    owner = run.job.owner
    result.gpu_seconds[owner] = result.gpu_seconds.get(owner, 0.0) + gpus * seconds
    result.cpu_seconds[owner] = result.cpu_seconds.get(owner, 0.0) + cpus * seconds
