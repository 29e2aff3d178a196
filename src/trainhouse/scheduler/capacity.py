"""What to ask a cluster's autoscaler for (pure): nodes for the waiting jobs that the cluster
could run if it had more nodes of a type the autoscaler can launch.

:func:`wants` walks the policy's waiting jobs in decision order over what the nodes have free
(after this pass's starts) and over the nodes asked for so far:

* a job waiting on its owner's quota is not asked for (nor one the quota would stop once the
  jobs asked for before it run), nor one the policy preempts for (the victims make its room);
* a job that fits the free capacity as it is waits for running jobs or a reservation, not for
  nodes: it takes that capacity and asks for none;
* any other job asks for as many nodes as it lacks, of the smallest launchable type that fits
  one node's share and has room under its ``max_workers`` (and the cluster's); the new nodes'
  leftover serves single-node jobs after it; a gang's new nodes are asked for whole (the
  autoscaler packs bundles, and a gang needs distinct nodes);
* a job no type has room for is left out, with the reason (its owner sees it).

:func:`never_fits` is the submit check counting the nodes the autoscaler can add.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from trainhouse.core.cluster import Bundle, Gpu, Node, NodeType, Want, Wants, bundle_of
from trainhouse.core.spec import Resources
from trainhouse.scheduler import resources
from trainhouse.scheduler.policy import Decisions, Snapshot, free_capacity, quota_block
from trainhouse.scheduler.resources import Free

__all__ = ["never_fits", "potential_nodes", "wants"]

NEW = "+"  # the names of nodes asked for in this pass start with it


def _launched(node_type: NodeType, number: int) -> Free:
    node = Node(
        f"{NEW}{node_type.name}-{number}",
        node_type.cpus,
        0,
        tuple(Gpu(i) for i in range(node_type.gpus)),
    )
    return Free(node, node_type.cpus, list(range(node_type.gpus)))


def wants(
    snapshot: Snapshot,
    decisions: Decisions,
    types: Sequence[NodeType],
    *,
    max_workers: int | None = None,
) -> Wants:
    """Which waiting jobs to ask the autoscaler for, and the bundles of what runs now.
    ``max_workers``: the cluster's cap on worker nodes of every type together (None: none)."""
    launchable = sorted((t for t in types if t.max_workers > 0), key=lambda t: (t.gpus, t.cpus))
    if not launchable or not decisions.waiting:
        return Wants()
    free = free_capacity(snapshot.nodes, snapshot.running)
    queued = {j.id: j for j in snapshot.queued}
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # owner -> [cpus, gpus]
    held: list[Bundle] = []
    for r in snapshot.running:
        used[r.owner][0] += r.cpus
        used[r.owner][1] += r.gpus
        held.extend(bundle_of(p.cpus, len(p.gpus)) for p in r.placements)
    for job_id, placements in decisions.starts:
        owner = queued[job_id].owner if job_id in queued else ""
        for p in placements:
            slot = free.get(p.node)
            if slot is not None:
                slot.cpus -= p.cpus
                slot.gpus = [g for g in slot.gpus if g not in p.gpus]
            used[owner][0] += p.cpus
            used[owner][1] += len(p.gpus)
            held.append(bundle_of(p.cpus, len(p.gpus)))
    room = {t.name: t.room for t in launchable}
    total_room = None if max_workers is None else max(max_workers - sum(t.up for t in types), 0)
    preempting_for = {p.for_job for p in decisions.preemptions}
    launched = 0
    kinds: dict[str, str] = {}  # the name of a node asked for -> its type
    asked: list[Want] = []
    unmet: dict[int, str] = {}
    for job_id in decisions.order:
        reason = decisions.waiting.get(job_id)
        job = queued.get(job_id)
        if reason is None or job is None or "quota:" in reason or job_id in preempting_for:
            continue
        if job.demand.elastic:  # asked for at its least: it grows onto what frees later
            job = replace(job, demand=job.demand.smallest())
        quota = snapshot.quotas.get(job.owner, snapshot.default_quota)
        if quota_block(job, quota, used[job.owner]):
            continue  # its owner's quota would stop it once the jobs before it run
        d = job.demand
        fitting = sorted(
            (f for f in free.values() if f.fits(d)),
            key=lambda f: (f.node.name.startswith(NEW), len(f.gpus), f.cpus, f.node.name),
        )[: d.nodes]
        missing = d.nodes - len(fitting)
        if missing == 0:
            for f in fitting:
                f.take(d)
            used[job.owner][0] += d.nodes * d.cpus
            used[job.owner][1] += d.nodes * d.gpus
            coming = [kinds[f.node.name] for f in fitting if f.node.name in kinds]
            if coming:  # it fits what nodes asked for before it leave: it waits for them too
                asked.append(
                    Want(job_id, coming[0], 0, tuple(bundle_of(d.cpus, d.gpus) for _ in fitting))
                )
            continue
        fits = [t for t in launchable if t.cpus >= d.cpus and t.gpus >= d.gpus]
        if not fits:
            continue  # only what is there could take it (the submit check let it in)
        chosen = next(
            (
                t
                for t in fits
                if room[t.name] >= missing and (total_room is None or total_room >= missing)
            ),
            None,
        )
        if chosen is None:
            full = ", ".join(
                f"{t.name} at {t.max_workers - room[t.name]} of max_workers {t.max_workers}"
                for t in fits
            )
            if max_workers is not None and total_room is not None and total_room < missing:
                full += (
                    f"; the cluster at {max_workers - total_room} of its max_workers {max_workers}"
                )
            unmet[job_id] = f"the autoscaler cannot add the {missing} node(s) it needs ({full})"
            continue
        bundles = [bundle_of(d.cpus, d.gpus) for f in fitting]
        for f in fitting:
            f.take(d)
        for _ in range(missing):
            launched += 1
            node = _launched(chosen, launched)
            node.take(d)
            if d.nodes > 1:  # a gang's node is asked for whole: never packed with another
                node.cpus, node.gpus = 0, []
                bundles.append(bundle_of(chosen.cpus, chosen.gpus))
            else:
                bundles.append(bundle_of(d.cpus, d.gpus))
            free[node.node.name] = node
            kinds[node.node.name] = chosen.name
        room[chosen.name] -= missing
        if total_room is not None:
            total_room -= missing
        used[job.owner][0] += d.nodes * d.cpus
        used[job.owner][1] += d.nodes * d.gpus
        asked.append(Want(job_id, chosen.name, missing, tuple(bundles)))
    return Wants(tuple(asked), tuple(held), unmet)


def potential_nodes(types: Sequence[NodeType]) -> list[Node]:
    """The nodes the autoscaler could still add (each type up to its ``max_workers``)."""
    return [_launched(t, i).node for t in types for i in range(1, t.room + 1) if t.max_workers > 0]


def never_fits(
    nodes: list[Node], types: Sequence[NodeType], res: Resources, *, multi_node: bool
) -> str | None:
    """Why ``res`` can never run on ``nodes`` and on every node the autoscaler could add, even
    idle (naming the node types), or None if it can."""
    reason = resources.never_fits(nodes + potential_nodes(types), res, multi_node=multi_node)
    launchable = [t for t in types if t.max_workers > 0]
    if reason is None or not launchable:
        return reason
    offers = ", ".join(f"{t.max_workers} x {t.offers()}" for t in launchable)
    return f"{reason} (with every node the autoscaler can launch: {offers})"
