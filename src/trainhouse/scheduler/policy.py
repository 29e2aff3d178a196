"""The scheduling policy: a pure function from a snapshot of the cluster to decisions.

This is the plain policy of the walking skeleton: priority tier first, then submission order
(FIFO), gang all-or-nothing on one node, and no backfill: a job that does not fit blocks the
jobs behind it, so big jobs are never starved by a stream of small ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainhouse.scheduler.resources import Free, Node, Placement
from trainhouse.spec import PRIORITY_TIERS, Resources


@dataclass(frozen=True)
class QueuedJob:
    id: int
    priority: str
    created_at: float
    resources: Resources


@dataclass(frozen=True)
class RunningJob:
    id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    queued: tuple[QueuedJob, ...]


@dataclass
class Decisions:
    starts: list[tuple[int, tuple[Placement, ...]]] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)


def order(queued: tuple[QueuedJob, ...]) -> list[QueuedJob]:
    """Decision order: higher tier first, then older first, then lower id."""
    return sorted(queued, key=lambda j: (-PRIORITY_TIERS.index(j.priority), j.created_at, j.id))


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


def _need(res: Resources) -> str:
    text = f"{res.cpus_per_node} CPU cores"
    if res.gpus_per_node:
        text += f" and {res.gpus_per_node} GPU(s)"
    return text + (" on one node" if res.nodes == 1 else f" on each of {res.nodes} nodes")


def decide(snapshot: Snapshot) -> Decisions:
    """Start queued jobs in order while they fit; explain why every other job waits."""
    free = free_capacity(snapshot.nodes, snapshot.running)
    decisions = Decisions()
    blocked_by: QueuedJob | None = None
    for position, job in enumerate(order(snapshot.queued), start=1):
        res = job.resources
        if blocked_by is not None:
            decisions.waiting[job.id] = (
                f"queue position {position}: waiting behind job {blocked_by.id} "
                f"({blocked_by.priority} priority), which is first in line"
            )
            continue
        candidates = [f for f in free.values() if f.fits(res)]
        if len(candidates) >= res.nodes:
            chosen = sorted(candidates, key=lambda f: (len(f.gpus), f.cpus))[: res.nodes]
            decisions.starts.append((job.id, tuple(f.take(res) for f in chosen)))
            continue
        best = max(free.values(), key=lambda f: (len(f.gpus), f.cpus), default=None)
        have = (
            f"{best.cpus} CPU cores"
            + (f" and {len(best.gpus)} GPU(s)" if best.node.gpus else "")
            + f" free on {best.node.name}"
            if best
            else "no nodes"
        )
        running = len(snapshot.running) + len(decisions.starts)
        decisions.waiting[job.id] = (
            f"queue position {position}: needs {_need(res)}; {have} ({running} job(s) running)"
        )
        blocked_by = job
    return decisions
