"""What the policy hands out: a job's demand per node, a node's free capacity while a pass
assigns it, and whether a job can ever fit (the resource model is
:mod:`trainhouse.core.cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainhouse.core.cluster import Node, Placement
from trainhouse.core.spec import Resources


@dataclass(frozen=True)
class Demand:
    """What a job needs on each of ``nodes`` nodes.

    An elastic job's demand is its largest size (``nodes`` x ``procs`` ranks) with the least it
    can run at (``min_nodes`` x ``min_procs``; 0: fixed) and what each rank takes
    (``cpus_per_proc``, ``gpus_per_proc``): :meth:`sizes` lists the sizes it may run at,
    :meth:`at` is the fixed demand of one of them.
    """

    nodes: int
    cpus: int
    gpus: int
    procs: int = 1
    min_nodes: int = 0
    min_procs: int = 0
    cpus_per_proc: int = 0
    gpus_per_proc: int = 0

    @classmethod
    def of(cls, res: Resources) -> Demand:
        if not res.elastic:
            return cls(res.max_nodes, res.cpus_per_node, res.gpus, res.procs)
        least, most = res.procs_range
        return cls(
            res.max_nodes,
            res.cpus_per_node,
            res.gpus,
            most,
            min_nodes=res.min_nodes,
            min_procs=least,
            cpus_per_proc=res.cpus_per_proc,
            gpus_per_proc=res.gpus_per_proc,
        )

    @property
    def elastic(self) -> bool:
        return bool(self.min_nodes) and (self.min_nodes, self.min_procs) != (self.nodes, self.procs)

    @property
    def world(self) -> int:
        return self.nodes * self.procs

    def at(self, nodes: int, procs: int) -> Demand:
        """This job at ``nodes`` x ``procs`` ranks (fixed)."""
        if not self.min_nodes:
            return self
        return Demand(nodes, procs * self.cpus_per_proc, procs * self.gpus_per_proc, procs)

    def smallest(self) -> Demand:
        """The least this job runs at (itself for a fixed job)."""
        return self.at(self.min_nodes, self.min_procs) if self.elastic else self.fixed()

    def fixed(self) -> Demand:
        """This demand without its range (the shape the policy places)."""
        return Demand(self.nodes, self.cpus, self.gpus, self.procs) if self.min_nodes else self

    def sizes(self) -> list[tuple[int, int]]:
        """Every (nodes, procs) this job may run at, largest world first (at a tie, fewer
        nodes); a fixed job's one size."""
        if not self.elastic:
            return [(self.nodes, self.procs)]
        out = [
            (n, p)
            for n in range(self.min_nodes, self.nodes + 1)
            for p in range(self.min_procs, self.procs + 1)
        ]
        out.sort(key=lambda s: (-s[0] * s[1], s[0]))
        return out


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


def place(free: dict[str, Free], demand: Demand) -> list[Free] | None:
    """Best fit: the fullest nodes that still fit, one per gang member; None if too few."""
    fitting = [f for f in free.values() if f.fits(demand)]
    if len(fitting) < demand.nodes:
        return None
    fitting.sort(key=lambda f: (len(f.gpus), f.cpus, f.node.name))
    return fitting[: demand.nodes]


def never_fits(nodes: list[Node], res: Resources, *, multi_node: bool = False) -> str | None:
    """Why ``res`` can never run on ``nodes`` even when they are idle, or None if it can."""
    if res.max_nodes > 1 and not multi_node:
        return (
            f"resources.nodes is {res.nodes}, but this server runs the local executor, which "
            "has one node; multi-node jobs need the Ray executor"
        )
    least = Demand.of(res).smallest()  # an elastic job needs only its least to run
    if least.nodes > len(nodes):
        return f"resources.nodes is {res.nodes}, but the cluster has {len(nodes)} node(s)"
    fitting = [n for n in nodes if n.cpus >= least.cpus and len(n.gpus) >= least.gpus]
    if len(fitting) >= least.nodes:
        return None
    biggest = max(nodes, key=lambda n: (len(n.gpus), n.cpus))
    need = f"{least.procs} rank(s) x {res.cpus_per_proc} CPU = {least.cpus} CPU cores"
    if least.gpus:
        need += f" and {least.gpus} GPU(s)"
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
    d = Demand.of(res).smallest()  # an elastic job counted at its least
    per_node = d.cpus
    slots = []
    for node in nodes:
        fit = node.cpus // per_node if per_node else 0
        if d.gpus:
            fit = min(fit, len(node.gpus) // d.gpus)
        slots.append(fit)
    total = sum(slots) // d.nodes if d.nodes > 1 else sum(slots)
    if max_cpus is not None:
        total = min(total, max_cpus // (per_node * d.nodes))
    if max_gpus is not None and d.gpus:
        total = min(total, max_gpus // (d.gpus * d.nodes))
    return max(total, 0)
