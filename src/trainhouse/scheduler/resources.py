"""What the policy hands out: a job's demand per node, a node's free capacity while a pass
assigns it, and whether a job can ever fit (the resource model is
:mod:`trainhouse.core.cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainhouse.core.cluster import Node, Placement
from trainhouse.core.spec import Resources


@dataclass(frozen=True)
class Demand:
    """What a job needs on each of ``nodes`` nodes."""

    nodes: int
    cpus: int
    gpus: int
    procs: int = 1

    @classmethod
    def of(cls, res: Resources) -> Demand:
        return cls(res.nodes, res.cpus_per_node, res.gpus_per_node, res.procs)


@dataclass
class Free:
    """Free capacity of one node while the policy hands it out."""

    node: Node
    cpus: int
    gpus: list[int] = field(default_factory=list)

    def fits(self, d: Demand) -> bool:
        return self.cpus >= d.cpus and len(self.gpus) >= d.gpus

    def take(self, d: Demand) -> Placement:
        gpus = tuple(sorted(self.gpus)[: d.gpus])
        self.gpus = [g for g in self.gpus if g not in gpus]
        self.cpus -= d.cpus
        return Placement(self.node.name, d.cpus, gpus, d.procs)


def never_fits(nodes: list[Node], res: Resources, *, multi_node: bool = False) -> str | None:
    """Why ``res`` can never run on ``nodes`` even when they are idle, or None if it can."""
    if res.nodes > 1 and not multi_node:
        return (
            f"resources.nodes is {res.nodes}, but this server runs the local executor, which "
            "has one node; multi-node jobs need the Ray executor"
        )
    if res.nodes > len(nodes):
        return f"resources.nodes is {res.nodes}, but the cluster has {len(nodes)} node(s)"
    fitting = [n for n in nodes if n.cpus >= res.cpus_per_node and len(n.gpus) >= res.gpus_per_node]
    if len(fitting) >= res.nodes:
        return None
    biggest = max(nodes, key=lambda n: (len(n.gpus), n.cpus))
    need = f"{res.procs} rank(s) x {res.cpus_per_proc} CPU = {res.cpus_per_node} CPU cores"
    if res.gpus_per_node:
        need += f" and {res.gpus_per_node} GPU(s)"
    return f"needs {need} per node; the largest node offers {biggest.describe().split(': ')[1]}"


def most_at_once(
    nodes: list[Node],
    res: Resources,
    *,
    max_cpus: int | None = None,
    max_gpus: int | None = None,
) -> int:
    """How many jobs of ``res`` could ever run at once on ``nodes`` (idle), within an owner's
    caps on CPUs and GPUs (None: no cap)."""
    per_node = res.cpus_per_node
    slots = []
    for node in nodes:
        fit = node.cpus // per_node if per_node else 0
        if res.gpus_per_node:
            fit = min(fit, len(node.gpus) // res.gpus_per_node)
        slots.append(fit)
    total = sum(slots) // res.nodes if res.nodes > 1 else sum(slots)
    if max_cpus is not None:
        total = min(total, max_cpus // (per_node * res.nodes))
    if max_gpus is not None and res.gpus_per_node:
        total = min(total, max_gpus // (res.gpus_per_node * res.nodes))
    return max(total, 0)
