"""Choosing preemption victims: strictly lower tiers, least work lost, as few as possible."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainhouse.core.spec import tier_rank
from trainhouse.scheduler.resources import Demand, Free

if TYPE_CHECKING:
    from trainhouse.scheduler.policy import QueuedJob, RunningJob


def _fits(cpus: int, gpus: int, d: Demand) -> bool:
    return cpus >= d.cpus and gpus >= d.gpus


def jobs_on_nodes(running: tuple[RunningJob, ...]) -> dict[str, list[RunningJob]]:
    """Each node's running jobs."""
    on_node: dict[str, list[RunningJob]] = {}
    for r in running:
        for p in r.placements:
            on_node.setdefault(p.node, []).append(r)
    return on_node


def held_on(r: RunningJob, node: str) -> tuple[int, int]:
    """(CPUs, GPUs) ``r`` holds on ``node``."""
    here = [p for p in r.placements if p.node == node]
    return sum(p.cpus for p in here), sum(len(p.gpus) for p in here)


def free_soon(f: Free, held: list[RunningJob]) -> tuple[int, int]:
    """(CPUs, GPUs) free on ``f``'s node once the jobs there already stopping have gone."""
    cpus, gpus = f.cpus, len(f.gpus)
    for r in held:
        if r.stopping:  # already on its way out: all it holds there comes back
            c, g = held_on(r, f.node.name)
            cpus, gpus = cpus + c, gpus + g
    return cpus, gpus


def choose_victims(
    job: QueuedJob, free: dict[str, Free], running: tuple[RunningJob, ...], now: float
) -> tuple[RunningJob, ...] | None:
    """Running jobs to preempt so that ``job`` fits, or None when none are needed or none help.

    None also when jobs already asked to stop will free enough: a job is never preempted twice
    for the same waiting job. Only jobs of a strictly lower tier are candidates, so a job can
    never be preempted by its own tier or a lower one and preemption cannot cycle.
    """
    d = job.demand
    tier = tier_rank(job.priority)
    on_node = jobs_on_nodes(running)
    options: list[tuple[int, float, str, tuple[RunningJob, ...]]] = []
    for name, f in free.items():
        if f.node.cpus < d.cpus or len(f.node.gpus) < d.gpus:
            continue
        held = on_node.get(name, [])
        cpus, gpus = free_soon(f, held)
        if _fits(cpus, gpus, d):
            options.append((0, 0.0, name, ()))
            continue
        candidates = sorted(
            (r for r in held if not r.stopping and tier_rank(r.priority) < tier),
            key=lambda r: (r.work_at_risk(now), -r.gpus, -r.cpus, r.id),
        )
        chosen: list[RunningJob] = []
        for r in candidates:
            if _fits(cpus, gpus, d):
                break
            chosen.append(r)
            c, g = held_on(r, name)
            cpus, gpus = cpus + c, gpus + g
        if not _fits(cpus, gpus, d):
            continue
        # as few as possible: drop any victim the node can do without, costliest first
        for r in sorted(chosen, key=lambda r: -r.work_at_risk(now)):
            c, g = held_on(r, name)
            if _fits(cpus - c, gpus - g, d):
                chosen.remove(r)
                cpus, gpus = cpus - c, gpus - g
        loss = sum(r.work_at_risk(now) for r in chosen)
        options.append((len(chosen), loss, name, tuple(chosen)))
    if len(options) < d.nodes:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    victims: dict[int, RunningJob] = {}
    for _, _, _, picked in options[: d.nodes]:
        for r in picked:
            victims[r.id] = r
    return tuple(victims.values()) or None
