"""The scheduling policy: a pure function from a snapshot of the cluster to decisions.

``decide(snapshot)`` returns which queued jobs start now and where (concrete nodes and GPU
indices), which running jobs to preempt, and a concrete reason for every job that keeps waiting.

Order: priority tier (``urgent > high > normal > low``), then fair share (the owner's decayed
usage divided by their share, charged as the pass hands out jobs, so users interleave), then
age. Walking that order:

* **Gang, all or nothing.** A job gets every node it asks for at once, or nothing.
* **Quotas.** A job that would take its owner past a GPU or CPU cap waits with reason ``quota``
  and does not hold up the jobs behind it.
* **Reservation and backfill.** The first job that does not fit gets a reservation: the nodes
  and the time it will start as running jobs end (their ``max_runtime`` tells when; a job with
  none may run forever). A job behind it starts now only if it cannot delay that reservation:
  it ends before the reserved time, or it leaves enough room on the reserved nodes.
* **Elastic jobs** (:mod:`~trainhouse.scheduler.elastic`) start at the largest size that fits
  without delaying the reservation, shrink (never below their least) before anything is
  preempted whole for a higher tier, and grow into what is left free when no job of higher or
  equal priority waits.
* **Preemption.** That first blocked job may preempt running jobs of a strictly lower tier
  when that makes it fit; victims lose the least work (time since their last checkpoint) and
  are as few as possible. While victims checkpoint and exit, nobody is preempted again for it.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from trainhouse.core.cluster import Node, Placement
from trainhouse.core.spec import tier_rank
from trainhouse.scheduler.elastic import Resize, choose_shrinks, grows, start_larger
from trainhouse.scheduler.preemption import choose_victims
from trainhouse.scheduler.resources import Demand, Free, place

INF = math.inf
# expected runtime charged to an owner's fair-share key for each job handed out in one pass
DEFAULT_EXPECTED_RUNTIME = 3600.0


@dataclass(frozen=True)
class QueuedJob:
    id: int
    priority: str
    created_at: float
    demand: Demand
    owner: str = "anonymous"
    max_runtime: float | None = None


@dataclass(frozen=True)
class RunningJob:
    id: int
    placements: tuple[Placement, ...]
    owner: str = "anonymous"
    priority: str = "normal"
    started_at: float = 0.0
    max_runtime: float | None = None
    last_checkpoint_at: float | None = None
    # asked to stop (preempted, resized or canceled); its resources come back by
    # ``stop_deadline``
    stopping: bool = False
    stop_deadline: float | None = None
    # an elastic job's range (None: fixed) and how long it runs at a size before it may grow
    demand: Demand | None = None
    resize_interval: float = 0.0

    @property
    def end_estimate(self) -> float:
        if self.stopping and self.stop_deadline is not None:
            return self.stop_deadline
        return self.started_at + self.max_runtime if self.max_runtime else INF

    def work_at_risk(self, now: float) -> float:
        """Seconds of work lost if it stopped now without a new checkpoint."""
        return max(now - (self.last_checkpoint_at or self.started_at), 0.0)

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    @property
    def cpus(self) -> int:
        return sum(p.cpus for p in self.placements)


@dataclass(frozen=True)
class Quota:
    gpus: int | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    queued: tuple[QueuedJob, ...]
    now: float = 0.0
    usage: Mapping[str, float] = field(default_factory=dict)  # decayed cluster-seconds
    shares: Mapping[str, float] = field(default_factory=dict)  # default 1.0
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    default_quota: Quota = Quota()
    preemption: bool = True


@dataclass(frozen=True)
class Preemption:
    victim: int
    for_job: int
    reason: str


@dataclass
class Decisions:
    starts: list[tuple[int, tuple[Placement, ...]]] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)  # elastic jobs shrunk or grown
    waiting: dict[int, str] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # queued job ids in decision order


# -- ordering ------------------------------------------------------------------------------


def cluster_totals(nodes: tuple[Node, ...] | list[Node]) -> tuple[int, int]:
    """(GPUs, CPU cores) of the whole cluster, what cost rates are fractions of."""
    return sum(len(n.gpus) for n in nodes), sum(n.cpus for n in nodes)


def cost_rate(demand: Demand, total_gpus: int, total_cpus: int) -> float:
    """The fraction of the cluster a job holds: GPUs for GPU jobs, CPU cores for CPU jobs."""
    if demand.gpus and total_gpus:
        return demand.nodes * demand.gpus / total_gpus
    return demand.nodes * demand.cpus / max(total_cpus, 1)


def order(snapshot: Snapshot) -> list[QueuedJob]:
    """Decision order: tier, then fair share (charged as jobs are handed out), then age."""
    total_gpus, total_cpus = cluster_totals(snapshot.nodes)
    by_tier: dict[int, dict[str, list[QueuedJob]]] = defaultdict(lambda: defaultdict(list))
    for job in snapshot.queued:
        by_tier[tier_rank(job.priority)][job.owner].append(job)
    charged: dict[str, float] = dict(snapshot.usage)
    out: list[QueuedJob] = []
    for tier in sorted(by_tier, reverse=True):
        queues = by_tier[tier]
        heap = []
        for owner, jobs in queues.items():
            jobs.sort(key=lambda j: (j.created_at, j.id))
            share = snapshot.shares.get(owner, 1.0) or 1.0
            key = charged.get(owner, 0.0) / share
            heap.append((key, jobs[0].created_at, jobs[0].id, owner, 0))
        heapq.heapify(heap)
        while heap:
            _, _, _, owner, index = heapq.heappop(heap)
            jobs = queues[owner]
            job = jobs[index]
            out.append(job)
            runtime = job.max_runtime or DEFAULT_EXPECTED_RUNTIME
            charged[owner] = charged.get(owner, 0.0) + runtime * cost_rate(
                job.demand, total_gpus, total_cpus
            )
            if index + 1 < len(jobs):
                nxt = jobs[index + 1]
                share = snapshot.shares.get(owner, 1.0) or 1.0
                heapq.heappush(
                    heap, (charged[owner] / share, nxt.created_at, nxt.id, owner, index + 1)
                )
    return out


# -- capacity ------------------------------------------------------------------------------


def free_capacity(nodes: tuple[Node, ...], running: tuple[RunningJob, ...]) -> dict[str, Free]:
    free = {n.name: Free(n, n.cpus, [g.index for g in n.gpus]) for n in nodes}
    for job in running:
        for p in job.placements:
            slot = free.get(p.node)
            if slot is None:
                continue
            slot.cpus -= p.cpus
            slot.gpus = [g for g in slot.gpus if g not in p.gpus]
    return free


@dataclass
class Reservation:
    """Where and when the first blocked job will start, and what is left there then."""

    job: QueuedJob
    at: float
    # node -> [cpus, gpus] free at ``at`` (after the reserved job is placed there)
    spare: dict[str, list[int]]

    def ends_in_time(self, end: float) -> bool:
        # an unknown reserved start (running jobs without max_runtime) may come any moment
        return self.at != INF and end <= self.at

    def delays(self, demand: Demand, nodes: list[Free], end: float) -> bool:
        if self.ends_in_time(end):
            return False
        return any(
            f.node.name in self.spare
            and (
                self.spare[f.node.name][0] < demand.cpus or self.spare[f.node.name][1] < demand.gpus
            )
            for f in nodes
        )

    def consume(self, demand: Demand, nodes: list[Free], end: float) -> None:
        if self.ends_in_time(end):
            return
        for f in nodes:
            if f.node.name in self.spare:
                self.spare[f.node.name][0] -= demand.cpus
                self.spare[f.node.name][1] -= demand.gpus


def reserve(
    job: QueuedJob, free: dict[str, Free], running: tuple[RunningJob, ...], now: float
) -> Reservation:
    """The earliest time and nodes at which ``job`` fits as running jobs end."""
    ends: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for r in running:
        for p in r.placements:
            ends[p.node].append((r.end_estimate, p.cpus, len(p.gpus)))
    d = job.demand
    candidates: list[tuple[float, str, int, int]] = []
    for name, f in free.items():
        if f.node.cpus < d.cpus or len(f.node.gpus) < d.gpus:
            continue
        cpus, gpus, at = f.cpus, len(f.gpus), now
        for end, c, g in sorted(ends[name]):
            if cpus >= d.cpus and gpus >= d.gpus:
                break
            cpus, gpus, at = cpus + c, gpus + g, end
        if cpus < d.cpus or gpus < d.gpus:
            cpus, gpus, at = f.node.cpus, len(f.node.gpus), INF
        candidates.append((at, name, cpus, gpus))
    candidates.sort(key=lambda c: (c[0], -c[3], -c[2], c[1]))
    chosen = candidates[: d.nodes]
    at = max((c[0] for c in chosen), default=INF)
    # what those nodes have left at `at`, once every job ending by then has gone
    spare: dict[str, list[int]] = {}
    for _, name, _, _ in chosen:
        f = free[name]
        cpus = f.cpus + sum(c for e, c, _ in ends[name] if e <= at)
        gpus = len(f.gpus) + sum(g for e, _, g in ends[name] if e <= at)
        spare[name] = [cpus - d.cpus, gpus - d.gpus]
    return Reservation(job, at, spare)


# -- explanations --------------------------------------------------------------------------


def need_text(d: Demand) -> str:
    text = f"{d.gpus} GPU(s) and {d.cpus} CPU cores" if d.gpus else f"{d.cpus} CPU cores"
    return text + (" on one node" if d.nodes == 1 else f" on each of {d.nodes} nodes")


def largest_block(free: dict[str, Free], d: Demand) -> str:
    if not free:
        return "no nodes"
    best = max(free.values(), key=lambda f: (len(f.gpus), f.cpus))
    if d.gpus:
        return (
            f"largest free block: {len(best.gpus)} GPU(s), {best.cpus} CPU cores "
            f"on {best.node.name}"
        )
    return f"largest free block: {best.cpus} CPU cores on {best.node.name}"


def when_text(at: float, now: float) -> str:
    if at == INF:
        return "when running jobs end (they set no max_runtime, so when is unknown)"
    seconds = max(at - now, 0)
    if seconds < 1:
        return "as soon as the jobs stopping there have exited"
    if seconds < 90:
        return f"in about {seconds:.0f} s"
    if seconds < 5400:
        return f"in about {seconds / 60:.0f} min"
    return f"in about {seconds / 3600:.1f} h"


def quota_block(job: QueuedJob, quota: Quota, used: list[int]) -> str | None:
    d = job.demand
    gpus, cpus = d.nodes * d.gpus, d.nodes * d.cpus
    if quota.gpus is not None and gpus and used[1] + gpus > quota.gpus:
        return f"quota: {job.owner} uses {used[1]} of {quota.gpus} GPUs; this job needs {gpus} more"
    if quota.cpus is not None and used[0] + cpus > quota.cpus:
        return (
            f"quota: {job.owner} uses {used[0]} of {quota.cpus} CPU cores; "
            f"this job needs {cpus} more"
        )
    return None


# -- the decision --------------------------------------------------------------------------


def decide(snapshot: Snapshot) -> Decisions:
    now = snapshot.now
    decisions = Decisions()
    ordered = order(snapshot)
    decisions.order = [j.id for j in ordered]
    free = free_capacity(snapshot.nodes, snapshot.running)
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # owner -> [cpus, gpus]
    for r in snapshot.running:
        used[r.owner][0] += r.cpus
        used[r.owner][1] += r.gpus
    reservation: Reservation | None = None
    waiting_by_tier: dict[int, int] = defaultdict(int)
    # free capacity only changes when a job starts: until then, reuse what was worked out
    # for a job of the same shape (thousands of waiting jobs come in a handful of shapes)
    placements: dict[tuple[int, int, int], list[Free] | None] = {}
    blocks: dict[bool, str] = {}

    def block(d: Demand) -> str:
        key = d.gpus > 0
        if key not in blocks:
            blocks[key] = largest_block(free, d)
        return blocks[key]

    for position, job in enumerate(ordered, start=1):
        d = job.demand
        tier = tier_rank(job.priority)
        where = f"queue position {position}"
        quota = snapshot.quotas.get(job.owner, snapshot.default_quota)
        if d.elastic:
            if start_larger(job, free, reservation, quota, used[job.owner], now, decisions.starts):
                placements.clear()
                blocks.clear()
                continue
            job = replace(job, demand=d.smallest())  # the rest of the walk: at its least
            d = job.demand
        blocked = quota_block(job, quota, used[job.owner])
        if blocked:
            decisions.waiting[job.id] = f"{where}: {blocked}"
            continue
        shape = (d.nodes, d.cpus, d.gpus)
        if shape not in placements:
            placements[shape] = place(free, d)
        nodes = placements[shape]
        end = now + job.max_runtime if job.max_runtime else INF
        if nodes is not None and (reservation is None or not reservation.delays(d, nodes, end)):
            if reservation is not None:
                reservation.consume(d, nodes, end)
            decisions.starts.append((job.id, tuple(f.take(d) for f in nodes)))
            placements.clear()
            blocks.clear()
            used[job.owner][0] += d.nodes * d.cpus
            used[job.owner][1] += d.nodes * d.gpus
            continue
        higher = sum(n for t, n in waiting_by_tier.items() if t > tier)
        waiting_by_tier[tier] += 1
        if reservation is not None:
            head = reservation.job
            ahead = f"; {higher} waiting job(s) ahead with higher priority" if higher else ""
            if nodes is not None:
                hint = "" if job.max_runtime else "; a short enough max_runtime lets it backfill"
                decisions.waiting[job.id] = (
                    f"{where}: fits now, but would delay the reserved start of job "
                    f"{head.id}{hint}{ahead}"
                )
            else:
                decisions.waiting[job.id] = (
                    f"{where}: needs {need_text(d)}; {block(d)}; job {head.id} "
                    f"is reserved to start first{ahead}"
                )
            continue
        # the first job that does not fit: preempt for it, or reserve for it
        reservation = block_head(snapshot, job, free, decisions, where, block(d))
    decisions.resizes.extend(grow_into(snapshot, decisions, free))
    return decisions


def grow_into(snapshot: Snapshot, decisions: Decisions, free: dict[str, Free]) -> list[Resize]:
    """The elastic jobs that grow into what a pass left ``free`` (none when no running job
    is elastic, so a queue of fixed jobs pays nothing for them)."""
    if not any(r.demand is not None for r in snapshot.running):
        return []
    return grows(
        snapshot.running,
        decisions,
        {job.id: job for job in snapshot.queued},
        free,
        snapshot.quotas,
        snapshot.default_quota,
        snapshot.now,
    )


def block_head(
    snapshot: Snapshot,
    job: QueuedJob,
    free: dict[str, Free],
    decisions: Decisions,
    where: str,
    block_text: str,
) -> Reservation:
    """The first job that does not fit: preempt for it (recorded in ``decisions``), reserve
    for it, and say why it waits."""
    now = snapshot.now
    d = job.demand
    note = ""
    shrinks = choose_shrinks(job, free, snapshot.running, now) if snapshot.preemption else None
    if shrinks:
        # elastic jobs of a lower tier give part of what they hold: nobody stops whole
        decisions.resizes.extend(shrinks)
        shrunk = {r.job for r in shrinks}
        running = tuple(
            RunningJob(**{**r.__dict__, "stopping": True, "stop_deadline": now})
            if r.id in shrunk
            else r
            for r in snapshot.running
        )
        names = ", ".join(
            f"{r.job} ({r.old[0] * r.old[1]}->{r.new[0] * r.new[1]})" for r in shrinks
        )
        note = f"; shrinking lower-priority elastic job(s) {names}, which checkpoint first"
    elif snapshot.preemption:
        victims = choose_victims(job, free, snapshot.running, now)
        if victims is not None:
            names = ", ".join(str(v.id) for v in victims)
            for v in victims:
                decisions.preemptions.append(
                    Preemption(
                        v.id,
                        job.id,
                        f"preempted by job {job.id} ({job.priority} priority), which needs "
                        f"its resources; resumes from its checkpoint",
                    )
                )
            running = tuple(
                RunningJob(**{**r.__dict__, "stopping": True, "stop_deadline": now})
                if r in victims
                else r
                for r in snapshot.running
            )
            note = f"; preempting lower-priority job(s) {names}, which checkpoint first"
        else:
            running = snapshot.running
            waiting_for = [r.id for r in snapshot.running if r.stopping]
            if waiting_for:
                note = f"; waiting for job(s) {', '.join(map(str, waiting_for))} to stop"
    else:
        running = snapshot.running
    reservation = reserve(job, free, running, now)
    target = ", ".join(sorted(reservation.spare)) or "no node"
    decisions.waiting[job.id] = (
        f"{where}: needs {need_text(d)}; {block_text}; reserved to start on "
        f"{target} {when_text(reservation.at, now)}{note}"
    )
    return reservation
