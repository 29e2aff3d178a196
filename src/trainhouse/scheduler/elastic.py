"""Elastic jobs in the policy: the size a job starts at, shrinks instead of preemption, growth.

An elastic job (``procs_per_node: "2:8"``, ``nodes: "1:4"``) has a :class:`Demand` with a range
(:meth:`Demand.sizes`). Three rules, each pure, called by :func:`policy.decide` and by the
incremental :func:`~trainhouse.scheduler.incremental.walk` alike:

* **Start** (:func:`larger_start`): at the largest size that fits now, within its owner's
  quota, and does not delay the reserved start of a job ahead of it (a job of higher or equal
  priority that waits). When no size above its least does, the job goes through the ordinary
  walk at its least size (:meth:`Demand.smallest`): a fixed job of that size.
* **Shrink** (:func:`choose_shrinks`): the first job that does not fit may shrink running
  elastic jobs of a strictly lower tier, never below their least size, on the nodes it will
  run on, before anything is preempted whole. Each shrink frees something on a node the job
  takes; none is kept that the job can do without. A shrink for priority is not held by the
  job's ``resize_interval``.
* **Grow** (:func:`grows`): a running elastic job below its largest size grows into capacity
  left free once the pass has started what it could, when its owner's quota allows and it has
  run at its size for ``resize_interval``, never into the room the pass reserved for a job of
  its tier or higher (the first job that does not fit: a growth may take only what a job
  behind that reservation could backfill; a job waiting on its own quota waits for no room).

A resize is checkpoint first: the loop asks the job to stop (``run.should_stop()``, reason
``resize``) and its next attempt starts from that checkpoint at the size the start rule gives
then. Resizes count against no restart budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainhouse.core.cluster import Placement
from trainhouse.core.spec import tier_rank
from trainhouse.scheduler.preemption import free_soon, held_on, jobs_on_nodes
from trainhouse.scheduler.resources import Demand, Free, place

if TYPE_CHECKING:
    from trainhouse.scheduler.policy import Decisions, QueuedJob, Quota, Reservation, RunningJob

Size = tuple[int, int]  # (nodes, ranks per node)
INF = math.inf


@dataclass(frozen=True)
class Resize:
    """A running elastic job asked to stop at a checkpoint and start again at ``new``."""

    job: int
    old: Size
    new: Size
    reason: str  # "shrunk 4->2: job 17 (high) needs 2 CPU cores" / "grew 2->4: 2 CPU cores freed"
    for_job: int | None = None  # the job a shrink makes room for

    @property
    def grow(self) -> bool:
        return self.new[0] * self.new[1] > self.old[0] * self.old[1]


def world(size: Size) -> int:
    return size[0] * size[1]


def current_size(job: RunningJob) -> Size:
    """(nodes, ranks per node) a running job has now."""
    return len(job.placements), max((p.procs for p in job.placements), default=1)


def quota_allows(quota: Quota, used: list[int], cpus: int, gpus: int) -> bool:
    """Whether ``cpus`` and ``gpus`` more stay within ``quota`` (``used``: [cpus, gpus])."""
    if quota.gpus is not None and gpus and used[1] + gpus > quota.gpus:
        return False
    return not (quota.cpus is not None and cpus and used[0] + cpus > quota.cpus)


def larger_start(
    job: QueuedJob,
    free: dict[str, Free],
    reservation: Reservation | None,
    quota: Quota,
    used: list[int],
    end: float,
) -> tuple[Demand, list[Free]] | None:
    """The largest size above its least at which elastic ``job`` can start now, and where;
    None when only its least is left to try (the walk's ordinary path)."""
    d = job.demand
    least = (d.min_nodes, d.min_procs)
    for size in d.sizes():
        if size == least:
            return None
        s = d.at(*size)
        if not quota_allows(quota, used, s.nodes * s.cpus, s.nodes * s.gpus):
            continue
        nodes = place(free, s)
        if nodes is None:
            continue
        if reservation is not None and reservation.delays(s, nodes, end):
            continue
        return s, nodes
    return None


def start_larger(
    job: QueuedJob,
    free: dict[str, Free],
    reservation: Reservation | None,
    quota: Quota,
    used: list[int],
    now: float,
    starts: list[tuple[int, tuple[Placement, ...]]],
) -> bool:
    """Start elastic ``job`` at :func:`larger_start`'s size, if it has one: its placements
    go into ``starts``, what it takes out of ``free``, ``used`` (its owner's [cpus, gpus]) and
    the reservation's spare room. Whether it started."""
    end = now + job.max_runtime if job.max_runtime else INF
    bigger = larger_start(job, free, reservation, quota, used, end)
    if bigger is None:
        return False
    s, taken = bigger
    if reservation is not None:
        reservation.consume(s, taken, end)
    starts.append((job.id, tuple(f.take(s) for f in taken)))
    used[0] += s.nodes * s.cpus
    used[1] += s.nodes * s.gpus
    return True


def _need_words(cpus: int, gpus: int) -> str:
    if gpus:
        return f"{gpus} GPU(s)" + (f" and {cpus} CPU cores" if cpus else "")
    return f"{cpus} CPU cores"


def choose_shrinks(
    job: QueuedJob, free: dict[str, Free], running: tuple[RunningJob, ...], now: float
) -> list[Resize] | None:
    """Shrinks of running elastic jobs of a strictly lower tier that make ``job`` (its demand
    fixed: the walk's blocked head) fit, the fewest and the least work lost; None when none
    are needed (jobs already stopping free enough) or shrinking alone cannot make it fit."""
    d = job.demand
    tier = tier_rank(job.priority)
    on_node = jobs_on_nodes(running)
    # per node: (shrinks, work lost, name, {job id: (drop this node, ranks per node here)})
    options: list[tuple[int, float, str, dict[int, tuple[bool, int]]]] = []
    for name, f in free.items():
        if f.node.cpus < d.cpus or len(f.node.gpus) < d.gpus:
            continue
        held = on_node.get(name, [])
        cpus, gpus = free_soon(f, held)
        if cpus >= d.cpus and gpus >= d.gpus:
            options.append((0, 0.0, name, {}))
            continue
        candidates = sorted(
            (
                r
                for r in held
                if not r.stopping
                and r.demand is not None
                and r.demand.elastic
                and tier_rank(r.priority) < tier
                and world(current_size(r)) > r.demand.min_nodes * r.demand.min_procs
            ),
            key=lambda r: (r.work_at_risk(now), r.id),
        )
        chosen: dict[int, tuple[bool, int]] = {}
        loss = 0.0
        for r in candidates:
            if cpus >= d.cpus and gpus >= d.gpus:
                break
            step = _shrink_on(r, name, d.cpus - cpus, d.gpus - gpus)
            if step is None:
                continue
            drop, procs, freed_cpus, freed_gpus = step
            chosen[r.id] = (drop, procs)
            loss += r.work_at_risk(now)
            cpus, gpus = cpus + freed_cpus, gpus + freed_gpus
        if cpus >= d.cpus and gpus >= d.gpus:
            options.append((len(chosen), loss, name, chosen))
    if len(options) < d.nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    picked = options[: d.nodes]
    if not any(o[3] for o in picked):
        return None  # jobs already stopping free enough
    by_id = {r.id: r for r in running}
    plans: dict[int, list[tuple[bool, int]]] = {}
    for _, _, _, shrunk in picked:
        for job_id, plan in shrunk.items():
            plans.setdefault(job_id, []).append(plan)
    resizes = []
    need_cpus, need_gpus = d.cpus * d.nodes, d.gpus * d.nodes
    for job_id, steps in sorted(plans.items()):
        r = by_id[job_id]
        assert r.demand is not None
        nodes, procs = current_size(r)
        new = (
            nodes - sum(1 for drop, _ in steps if drop),
            min([p for drop, p in steps if not drop] or [procs]),
        )
        if new[0] < r.demand.min_nodes or new[1] < r.demand.min_procs:
            return None  # shrinking it on every node asked would go below its least
        resizes.append(
            Resize(
                job_id,
                (nodes, procs),
                new,
                f"shrunk {nodes * procs}->{world(new)}: job {job.id} ({job.priority}) needed "
                f"{_need_words(need_cpus, need_gpus)}",
                for_job=job.id,
            )
        )
    return resizes


def _shrink_on(
    r: RunningJob, node: str, short_cpus: int, short_gpus: int
) -> tuple[bool, int, int, int] | None:
    """The least shrink of ``r`` that frees ``short_cpus`` and ``short_gpus`` on ``node`` (or
    the most it can free there): (drop the node, ranks per node, CPUs freed, GPUs freed)."""
    assert r.demand is not None
    d = r.demand
    if not any(p.node == node for p in r.placements):
        return None
    held_cpus, held_gpus = held_on(r, node)
    nodes, procs = current_size(r)
    steps: list[tuple[bool, int, int, int]] = []
    for fewer in range(procs - 1, d.min_procs - 1, -1):  # fewer ranks on every node
        gone = procs - fewer
        steps.append((False, fewer, gone * d.cpus_per_proc, gone * d.gpus_per_proc))
    if nodes > d.min_nodes:  # or leave this node
        steps.append((True, procs, held_cpus, held_gpus))
    if not steps:
        return None
    # the largest size left that covers the shortfall; else the one that frees the most
    enough = [s for s in steps if s[2] >= short_cpus and s[3] >= max(short_gpus, 0)]
    if enough:
        return max(enough, key=lambda s: _left(s, nodes, procs))
    return max(steps, key=lambda s: (s[2] + s[3], -_left(s, nodes, procs)))


def _left(step: tuple[bool, int, int, int], nodes: int, procs: int) -> int:
    drop, fewer = step[0], step[1]
    return (nodes - 1) * procs if drop else nodes * fewer


def grows(
    running: tuple[RunningJob, ...],
    decisions: Decisions,
    queued: Mapping[int, QueuedJob],
    free: dict[str, Free],
    quotas: Mapping[str, Quota],
    default_quota: Quota,
    now: float,
    reservation: Reservation | None = None,
) -> list[Resize]:
    """Running elastic jobs that grow into ``free`` (what is left after this pass's starts,
    taken from as jobs grow), higher tiers first, then the longest at their size.

    A job waits for capacity only behind the pass's ``reservation`` (the first job that did
    not fit; one waiting on its own quota waits for no capacity): when that job's tier is as
    high as the growing job's or higher, the growth takes only what a job behind the
    reservation could backfill (room the reserved start does not need); otherwise it takes
    what is free."""
    head = tier_rank(reservation.job.priority) if reservation is not None else -1
    started = {job_id for job_id, _ in decisions.starts}
    shrinking = {p.victim for p in decisions.preemptions} | {r.job for r in decisions.resizes}
    used: dict[str, list[int]] = {}
    for r in running:
        u = used.setdefault(r.owner, [0, 0])
        u[0] += r.cpus
        u[1] += r.gpus
    for job_id, placements in decisions.starts:
        if job_id in queued:
            u = used.setdefault(queued[job_id].owner, [0, 0])
            u[0] += sum(p.cpus for p in placements)
            u[1] += sum(len(p.gpus) for p in placements)
    out: list[Resize] = []
    candidates = sorted(
        (
            r
            for r in running
            if r.demand is not None
            and r.demand.elastic
            and not r.stopping
            and r.id not in shrinking
            and r.id not in started
            and now - r.started_at >= r.resize_interval
            and world(current_size(r)) < r.demand.world
        ),
        key=lambda r: (-tier_rank(r.priority), r.started_at, r.id),
    )
    for r in candidates:
        guard = reservation if head >= tier_rank(r.priority) else None
        quota = quotas.get(r.owner, default_quota)
        grown = _grow(r, free, quota, used.setdefault(r.owner, [0, 0]), guard)
        if grown is not None:
            out.append(grown)
    return out


def _grow(
    r: RunningJob, free: dict[str, Free], quota: Quota, used: list[int], guard: Reservation | None
) -> Resize | None:
    """The largest size ``r`` can grow to on its own nodes and free ones (taken from ``free``,
    ``used`` and the ``guard`` reservation's spare room when it does), never delaying the
    reserved start of ``guard``'s job."""
    assert r.demand is not None
    d = r.demand
    nodes, procs = current_size(r)
    own = {p.node: p for p in r.placements}
    spare_room = guard.spare if guard is not None else {}
    counted = guard is not None and guard.at != INF and r.end_estimate <= guard.at
    if counted and any(n in spare_room for n in own):
        return None  # the reservation counts on its end: a restart would put that off

    def room(name: str, cpus: int, gpus: int) -> bool:
        left = spare_room.get(name)
        return left is None or (left[0] >= cpus and left[1] >= gpus)

    for size in d.sizes():
        n, p = size
        if world(size) <= nodes * procs:
            break  # largest first: no larger size is left
        if n < nodes or p < procs:
            continue  # it grows where it runs: no node given up, no fewer ranks on one
        more_cpus, more_gpus = (p - procs) * d.cpus_per_proc, (p - procs) * d.gpus_per_proc
        if any(
            name not in free
            or free[name].cpus < more_cpus
            or len(free[name].gpus) < more_gpus
            or not room(name, more_cpus, more_gpus)
            for name in own
        ):
            continue
        extra = d.at(1, p)
        spare = sorted(
            (
                f
                for name, f in free.items()
                if name not in own and f.fits(extra) and room(name, extra.cpus, extra.gpus)
            ),
            key=lambda f: (len(f.gpus), f.cpus, f.node.name),
        )[: n - nodes]
        if len(spare) < n - nodes:
            continue
        cpus = more_cpus * nodes + extra.cpus * (n - nodes)
        gpus = more_gpus * nodes + extra.gpus * (n - nodes)
        if not quota_allows(quota, used, cpus, gpus):
            continue
        for name in own:
            f = free[name]
            f.cpus -= more_cpus
            f.gpus = sorted(f.gpus)[more_gpus:]
            if name in spare_room:
                spare_room[name][0] -= more_cpus
                spare_room[name][1] -= more_gpus
        for f in spare:
            f.take(extra)
            if f.node.name in spare_room:
                spare_room[f.node.name][0] -= extra.cpus
                spare_room[f.node.name][1] -= extra.gpus
        used[0] += cpus
        used[1] += gpus
        freed = _need_words(cpus, gpus)
        return Resize(r.id, (nodes, procs), size, f"grew {nodes * procs}->{n * p}: {freed} freed")
    return None
