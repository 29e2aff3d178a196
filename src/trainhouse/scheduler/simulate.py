"""A discrete-event simulation of a cluster driven by the real policy.

Used by the property tests (starvation, fair share, preemption) and by ``bench/scheduler.py``
(decision time and utilisation against FIFO without backfill). Time jumps from event to event:
an arrival, a job's end, a preempted job's stop, the moment an elastic job below its largest
size may grow. A preempted job loses the work since its last checkpoint and goes back to the
queue.

Elastic jobs (a :class:`Demand` with a range) run at the size the policy starts them at and are
resized by ``Decisions.resizes``. A job's work is measured in rank-seconds: ``SimJob.runtime``
is its wall time at its largest size, so it needs ``runtime`` x (its largest world) rank-seconds,
and an attempt at ``w`` ranks does ``w`` of them per second: **linear scaling**, a job at half
its size runs half as fast (no real job scales better than that, and many worse). A resize is
checkpoint first, as in the loop: the job stops at once with none of its work lost, goes back to
the queue with its original submission time, and its next attempt starts at the size the
start rule gives then, after ``resize_overhead`` seconds (60) of setup in which it holds its
GPUs and does no work (the restart: processes, rendezvous, loading the checkpoint). Running
elastic jobs are shown to the policy with their range and ``SimJob.resize_interval`` (300 s),
and the policy is asked also with an empty queue while one of them could grow. A fixed job's
simulation is exactly what it was before elastic jobs (rate 1, no setup).
"""

from __future__ import annotations

import math
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

DEFAULT_RESIZE_INTERVAL = 300.0  # seconds an elastic job runs at a size before it may grow
RESIZE_OVERHEAD = 60.0  # seconds of setup of the attempt after a resize (no work done)

Size = tuple[int, int]  # (nodes, ranks per node)


@dataclass(frozen=True)
class SimAttempt:
    """One stretch a job held resources: ``ranks`` ranks on ``gpus`` GPUs from ``start`` to
    ``end``, the first ``setup`` seconds of it without work (after a resize)."""

    job: int
    start: float
    end: float
    ranks: int
    gpus: int
    setup: float = 0.0


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
    # an elastic job's (a demand with a range): how long it runs at a size before it may grow
    resize_interval: float = DEFAULT_RESIZE_INTERVAL


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
    # (job, old size, new size, when) of every resize applied
    resizes: list[tuple[int, Size, Size, float]] = field(default_factory=list)
    setup_gpu_seconds: float = 0.0  # GPUs held in the setup after resizes, no work done
    attempts: list[SimAttempt] = field(default_factory=list)  # every stretch, in end order

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
    remaining_at_start: float  # work left, in seconds at the job's largest size
    held: Demand  # the fixed demand of the size it runs at (a fixed job's own)
    rate: float = 1.0  # work per second: ranks / the largest world (1 for a fixed job)
    setup: float = 0.0  # seconds without work at the start (after a resize)

    @property
    def end(self) -> float:
        return self.started + self.setup + self.remaining_at_start / self.rate

    def work(self, seconds: float) -> float:
        """Work done (seconds at the largest size) in its first ``seconds``."""
        return max(seconds - self.setup, 0.0) * self.rate

    def shown(self, now: float) -> RunningJob:
        """What the policy sees of it at ``now``."""
        job = self.job
        every = job.checkpoint_every
        checkpoint = self.started + ((now - self.started) // every) * every
        return RunningJob(
            job.id,
            self.placements,
            job.owner,
            job.priority,
            self.started,
            job.max_runtime,
            checkpoint,
            demand=job.demand if job.demand.elastic else None,
            resize_interval=job.resize_interval,
        )

    @property
    def may_grow_at(self) -> float | None:
        """When an elastic job below its largest size may grow (None: never)."""
        d = self.job.demand
        if not d.elastic or sum(p.procs for p in self.placements) >= d.world:
            return None
        at = self.started + self.job.resize_interval
        while at - self.started < self.job.resize_interval:  # the policy's own test holds
            at = math.nextafter(at, math.inf)
        return at


def simulate(
    nodes: Sequence[Node],
    jobs: Sequence[SimJob],
    *,
    policy: Callable[[Snapshot], Decisions] = decide,
    until: float | None = None,
    half_life: float = DEFAULT_HALF_LIFE,
    entry_seconds: float = DEFAULT_ENTRY_SECONDS,
    max_events: int = 1_000_000,
    resize_overhead: float = RESIZE_OVERHEAD,
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
    resized: set[int] = set()  # queued after a resize: its next attempt pays the setup
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
            if run.end <= now + 1e-9:
                _account(result, run, now)
                del running[job_id]
                remaining[job_id] = 0.0
                result.finished[job_id] = now
        ledger.advance(
            now,
            [(r.job.owner, cost_rate(r.held, total_gpus, total_cpus)) for r in running.values()],
        )
        grows = [t for r in running.values() if (t := r.may_grow_at) is not None]
        if queued or any(t <= now for t in grows):
            snap = Snapshot(
                nodes,
                tuple(r.shown(now) for r in running.values()),
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
                remaining[pre.victim] = run.remaining_at_start - run.work(kept)
                queued[pre.victim] = _queued(run.job, now)
                result.preemptions.append((pre.victim, pre.for_job))
            for resize in decisions.resizes:
                # checkpoint first: it stops now with all its work kept, and is queued again
                # with its submission time; its next attempt starts at the size that fits then
                run = running.pop(resize.job)
                _account(result, run, now)
                left = run.remaining_at_start - run.work(now - run.started)
                remaining[resize.job] = max(left, 0.0)
                queued[resize.job] = _queued(run.job, run.job.submit_at)
                resized.add(resize.job)
                result.resizes.append((resize.job, resize.old, resize.new, now))
            for job_id, placements in decisions.starts:
                job = by_id[job_id]
                running[job_id] = _start(job, placements, now, remaining[job_id])
                if job_id in resized:
                    resized.discard(job_id)
                    running[job_id].setup = resize_overhead
                result.started.setdefault(job_id, now)
                del queued[job_id]
                held = running[job_id].held
                ledger.charge_start(job.owner, cost_rate(held, total_gpus, total_cpus))
            if queued and result.first_wait is None:
                result.first_wait = now
            if decisions.preemptions or decisions.resizes:
                continue  # the freed room is handed out at the same instant
        nxt = [r.end for r in running.values()]
        # an elastic job below its largest size may grow once it has run its resize_interval
        nxt.extend(t for r in running.values() if (t := r.may_grow_at) is not None and t > now)
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


def _start(job: SimJob, placements: tuple[Placement, ...], now: float, left: float) -> _Run:
    d = job.demand
    if not d.elastic:
        return _Run(job, placements, now, left, d)
    ranks = sum(p.procs for p in placements)
    held = d.at(len(placements), max(p.procs for p in placements))
    return _Run(job, placements, now, left, held, rate=ranks / d.world)


def _account(result: SimResult, run: _Run, now: float) -> None:
    seconds = max(now - run.started, 0.0)
    gpus = sum(len(p.gpus) for p in run.placements)
    result.segments.append((run.started, run.started + seconds, gpus))
    ranks = sum(p.procs for p in run.placements)
    setup = min(run.setup, seconds)
    result.attempts.append(
        SimAttempt(run.job.id, run.started, run.started + seconds, ranks, gpus, setup)
    )
    result.setup_gpu_seconds += gpus * setup
    cpus = sum(p.cpus for p in run.placements)
    owner = run.job.owner
    result.gpu_seconds[owner] = result.gpu_seconds.get(owner, 0.0) + gpus * seconds
    result.cpu_seconds[owner] = result.cpu_seconds.get(owner, 0.0) + cpus * seconds
