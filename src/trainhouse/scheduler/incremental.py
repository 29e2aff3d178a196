"""The policy kept between decisions: exactly the decisions of :func:`policy.decide`, cheaper.

``decide(snapshot)`` rebuilds everything from the snapshot each time: it groups the queue by
tier and owner, sorts every owner's jobs by age, merges them by fair share and then works out
for every queued job, one by one, whether it starts and why not. With 10,000 queued jobs that
is most of a decision, and almost none of it changes between two ticks.

:class:`Scheduler` keeps the queue grouped and sorted between decisions (:class:`QueueIndex`)
and is told what changed: a job queued, started, ended or canceled, a priority changed
(:meth:`Scheduler.queued`, :meth:`Scheduler.removed`), or works that out itself from the next
snapshot's queue (:meth:`QueueIndex.sync`, what the loop and the simulation use). Its pass
(:func:`walk`) makes the same walk in the same order as ``decide()`` but works things out once
per *epoch*, the stretch of the walk between two starts in which free capacity, the
reservation and everyone's quota use stay as they are: where a job shape would go, whether it
would delay the reservation, what its reason says. Once a reservation stands and no shape
still queued fits the free capacity, nothing more can start: the rest of the queue only gets
its reason (quota, or the shared text of its shape and tier) with its position.

The per-user fair-share usage lives between decisions in the caller's
:class:`~trainhouse.scheduler.fairshare.UsageLedger` (the loop's and the simulation's), decayed
and charged by deltas; the snapshot carries a copy of it (one entry per user).

``decide()`` stays the reference. ``tests/unit/test_incremental.py`` checks on random seeded
sequences of snapshots that both make exactly the same decisions (starts and where,
preemptions, every reason and the order).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from heapq import heapify, heappop, heapreplace

from trainhouse.core.spec import PRIORITY_TIERS, tier_rank
from trainhouse.scheduler.elastic import start_larger
from trainhouse.scheduler.policy import (
    DEFAULT_EXPECTED_RUNTIME,
    INF,
    Decisions,
    QueuedJob,
    Quota,
    Reservation,
    Snapshot,
    block_head,
    cluster_totals,
    cost_rate,
    free_capacity,
    grow_into,
    largest_block,
    need_text,
    quota_block,
)
from trainhouse.scheduler.resources import Demand, Free, place

__all__ = ["QueueIndex", "Scheduler", "walk"]

RANKS = {tier: tier_rank(tier) for tier in PRIORITY_TIERS}
Shape = tuple[int, int, int]  # (nodes, cpus, gpus) of a demand
Entry = tuple[float, int, QueuedJob]  # (created_at, id, job): an owner's lane sorts by age


def shape_of(d: Demand) -> Shape:
    """A demand's shape; an elastic job's least (no larger size fits where that does not)."""
    if d.elastic:
        d = d.smallest()
    return d.nodes, d.cpus, d.gpus


class QueueIndex:
    """The queued jobs by tier and owner, each owner's jobs of a tier sorted by age.

    What :func:`policy.order` builds from scratch at every decision, kept up to date by deltas.
    """

    def __init__(self, jobs: Iterable[QueuedJob] = ()) -> None:
        self.jobs: dict[int, QueuedJob] = {}
        # tier rank -> owner -> (created_at, id, job), oldest first
        self.lanes: dict[int, dict[str, list[Entry]]] = {}
        self.shapes: dict[Shape, int] = {}  # how many queued jobs have each shape
        self._charges: dict[int, float] = {}  # job id -> fair-share charge, for ``_totals``
        self._totals: tuple[int, int] = (-1, -1)
        for job in jobs:
            self.add(job)

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs

    def add(self, job: QueuedJob) -> None:
        """A job joined the queue, or one in it changed (priority, owner, demand, ...)."""
        if job.id in self.jobs:
            self.remove(job.id)
        self.jobs[job.id] = job
        owners = self.lanes.setdefault(tier_rank(job.priority), {})
        insort(owners.setdefault(job.owner, []), (job.created_at, job.id, job))
        shape = shape_of(job.demand)
        self.shapes[shape] = self.shapes.get(shape, 0) + 1

    def remove(self, job_id: int) -> QueuedJob | None:
        """A job left the queue (started, canceled, ended); None if it was not in it."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        tier = tier_rank(job.priority)
        owners = self.lanes[tier]
        lane = owners[job.owner]
        del lane[bisect_left(lane, (job.created_at, job.id))]
        if not lane:
            del owners[job.owner]
            if not owners:
                del self.lanes[tier]
        shape = shape_of(job.demand)
        self.shapes[shape] -= 1
        if not self.shapes[shape]:
            del self.shapes[shape]
        self._charges.pop(job_id, None)
        return job

    def sync(self, queued: Iterable[QueuedJob]) -> int:
        """Hold exactly ``queued`` (the next snapshot's queue); how many jobs changed."""
        fresh = {job.id: job for job in queued}
        gone = [job_id for job_id in self.jobs if job_id not in fresh]
        for job_id in gone:
            self.remove(job_id)
        changed = len(gone)
        jobs = self.jobs
        for job_id, job in fresh.items():
            old = jobs.get(job_id)
            if old is not job and old != job:
                self.add(job)
                changed += 1
        return changed

    def order(
        self, usage: Mapping[str, float], shares: Mapping[str, float], totals: tuple[int, int]
    ) -> list[QueuedJob]:
        """The decision order, the same as :func:`policy.order` (tier, charged fair share,
        age), merged from the sorted lanes without sorting anything."""
        if totals != self._totals:
            self._charges.clear()
            self._totals = totals
        charges = self._charges
        total_gpus, total_cpus = totals
        charged: dict[str, float] = dict(usage)
        out: list[QueuedJob] = []
        append = out.append
        for tier in sorted(self.lanes, reverse=True):
            owners = self.lanes[tier]
            share = {owner: shares.get(owner, 1.0) or 1.0 for owner in owners}
            heap = [
                (charged.get(owner, 0.0) / share[owner], lane[0][0], lane[0][1], owner, 0)
                for owner, lane in owners.items()
            ]
            heapify(heap)
            while heap:
                _, _, job_id, owner, index = heap[0]
                lane = owners[owner]
                job = lane[index][2]
                append(job)
                charge = charges.get(job_id)
                if charge is None:
                    runtime = job.max_runtime or DEFAULT_EXPECTED_RUNTIME
                    charge = runtime * cost_rate(job.demand, total_gpus, total_cpus)
                    charges[job_id] = charge
                key = charged[owner] = charged.get(owner, 0.0) + charge
                index += 1
                if index < len(lane):
                    created, nxt, _ = lane[index]
                    # keys are unique (job ids are), so pop-then-push and replace pop the same
                    heapreplace(heap, (key / share[owner], created, nxt, owner, index))
                else:
                    heappop(heap)
        return out


class Scheduler:
    """The policy with its queue kept between decisions; ``decide()`` gives what
    :func:`policy.decide` would for the same snapshot."""

    def __init__(self, queued: Iterable[QueuedJob] = ()) -> None:
        self.index = QueueIndex(queued)

    def queued(self, job: QueuedJob) -> None:
        """A job joined the queue, came back to it (preempted, restarting) or changed in it."""
        self.index.add(job)

    def removed(self, job_id: int) -> None:
        """A job left the queue: it started, was canceled or ended."""
        self.index.remove(job_id)

    def decide(self, snapshot: Snapshot, *, sync: bool = True) -> Decisions:
        """Decisions for ``snapshot``. With ``sync`` the index first takes the snapshot's
        queue (cheap when little changed); without, the caller vouches that the deltas it
        reported make the index hold exactly ``snapshot.queued``."""
        if sync:
            self.index.sync(snapshot.queued)
        totals = cluster_totals(snapshot.nodes)
        return walk(snapshot, self.index.order(snapshot.usage, snapshot.shares, totals), self.index)

    __call__ = decide


def stuck(
    free: dict[str, Free], shapes: Iterable[Shape], fits: dict[Shape, list[Free] | None]
) -> bool:
    """Whether no shape fits the free capacity (what fits where goes into ``fits``)."""
    for shape in shapes:
        if shape not in fits:
            fits[shape] = place(free, Demand(*shape))
    return all(fits[shape] is None for shape in shapes)


def walk(
    snapshot: Snapshot, ordered: list[QueuedJob], index: QueueIndex | None = None
) -> Decisions:
    """The pass of :func:`policy.decide` over jobs already in decision order, working out what
    a job shape can do once per epoch (between two starts). ``index`` (holding exactly
    ``ordered``) tells which shapes are queued, for stopping early."""
    now = snapshot.now
    decisions = Decisions()
    decisions.order = [job.id for job in ordered]
    waiting = decisions.waiting
    free = free_capacity(snapshot.nodes, snapshot.running)
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # owner -> [cpus, gpus]
    for r in snapshot.running:
        used[r.owner][0] += r.cpus
        used[r.owner][1] += r.gpus
    quotas, default_quota = snapshot.quotas, snapshot.default_quota
    # whose quota can block a job: everyone's with a default quota, else those with a quota
    limited = None if limits(default_quota) else {o for o, q in quotas.items() if limits(q)}
    shapes = set(index.shapes) if index is not None else {shape_of(j.demand) for j in ordered}
    reservation: Reservation | None = None
    # per epoch: where a shape goes (None: it does not fit), whether it delays the
    # reservation (by whether the job ends in time), the reason text of a shape in a tier
    fits: dict[Shape, list[Free] | None] = {}
    delays: dict[tuple[Shape, bool], bool] = {}
    gists: dict[tuple[Shape, bool, int], str] = {}
    blocks: dict[bool, str] = {}
    waiting_by_tier = [0] * len(RANKS)
    tier, higher = -1, 0  # the order is by tier first: the count ahead is fixed within a tier

    def block(d: Demand) -> str:
        key = d.gpus > 0
        if key not in blocks:
            blocks[key] = largest_block(free, d)
        return blocks[key]

    position = 0
    for position, job in enumerate(ordered, start=1):
        d = job.demand
        if d.elastic:  # the same rule as decide(): its largest size that starts now
            quota = quotas.get(job.owner, default_quota)
            if start_larger(job, free, reservation, quota, used[job.owner], now, decisions.starts):
                fits.clear()
                delays.clear()
                gists.clear()
                blocks.clear()
                if reservation is not None and stuck(free, shapes, fits):
                    break
                continue
            job = replace(job, demand=d.smallest())
            d = job.demand
        if limited is None or job.owner in limited:
            quota = quotas.get(job.owner, default_quota)
            blocked = quota_block(job, quota, used[job.owner])
            if blocked:
                waiting[job.id] = f"queue position {position}: {blocked}"
                continue
        shape = (d.nodes, d.cpus, d.gpus)
        if shape not in fits:
            fits[shape] = place(free, d)
        nodes = fits[shape]
        if nodes is not None:
            if reservation is None:
                can_start = True
            else:
                end = now + job.max_runtime if job.max_runtime else INF
                in_time = reservation.ends_in_time(end)
                if (shape, in_time) not in delays:
                    delays[shape, in_time] = reservation.delays(d, nodes, end)
                can_start = not delays[shape, in_time]
                if can_start:
                    reservation.consume(d, nodes, end)
            if can_start:
                decisions.starts.append((job.id, tuple(f.take(d) for f in nodes)))
                fits.clear()
                delays.clear()
                gists.clear()
                blocks.clear()
                used[job.owner][0] += d.nodes * d.cpus
                used[job.owner][1] += d.nodes * d.gpus
                if reservation is not None and stuck(free, shapes, fits):
                    break
                continue
        rank = RANKS[job.priority]
        if rank != tier:
            tier, higher = rank, sum(waiting_by_tier[rank + 1 :])
        waiting_by_tier[rank] += 1
        if reservation is None:
            where = f"queue position {position}"
            reservation = block_head(snapshot, job, free, decisions, where, block(d))
            gists.clear()
            if stuck(free, shapes, fits):
                break
            continue
        key = (shape, bool(job.max_runtime), rank)
        gist = gists.get(key)
        if gist is None:
            head = reservation.job
            ahead = f"; {higher} waiting job(s) ahead with higher priority" if higher else ""
            if nodes is not None:
                hint = "" if job.max_runtime else "; a short enough max_runtime lets it backfill"
                gist = f"fits now, but would delay the reserved start of job {head.id}{hint}{ahead}"
            else:
                gist = (
                    f"needs {need_text(d)}; {block(d)}; job {head.id} "
                    f"is reserved to start first{ahead}"
                )
            gists[key] = gist
        waiting[job.id] = f"queue position {position}: {gist}"
    else:
        decisions.resizes.extend(grow_into(snapshot, decisions, free))
        return decisions
    # Nothing more can start: a reservation stands and no queued shape fits. Every job after
    # ``position`` waits, for its quota or with its shape's reason in its tier.
    assert reservation is not None
    head = reservation.job
    tail_gists: dict[tuple[Shape, int], str] = {}
    done = position
    for position, job in enumerate(ordered[done:], start=done + 1):
        if job.demand.elastic:  # nothing fits: it waits at its least, as in decide()
            job = replace(job, demand=job.demand.smallest())
        if limited is None or job.owner in limited:
            quota = quotas.get(job.owner, default_quota)
            blocked = quota_block(job, quota, used[job.owner])
            if blocked:
                waiting[job.id] = f"queue position {position}: {blocked}"
                continue
        d = job.demand
        rank = RANKS[job.priority]
        if rank != tier:
            tier, higher = rank, sum(waiting_by_tier[rank + 1 :])
        waiting_by_tier[rank] += 1
        shape = (d.nodes, d.cpus, d.gpus)
        gist = tail_gists.get((shape, rank))
        if gist is None:
            ahead = f"; {higher} waiting job(s) ahead with higher priority" if higher else ""
            gist = (
                f"needs {need_text(d)}; {block(d)}; job {head.id} is reserved to start first{ahead}"
            )
            tail_gists[shape, rank] = gist
        waiting[job.id] = f"queue position {position}: {gist}"
    decisions.resizes.extend(grow_into(snapshot, decisions, free))
    return decisions


def limits(quota: Quota) -> bool:
    return quota.gpus is not None or quota.cpus is not None
