"""The resource model every layer shares: nodes with CPUs, memory and GPUs, and placements.

A :class:`Placement` says where one node's share of a job runs (concrete GPU indices and a CPU
count); a job spans a tuple of them, one per node, stored as ``{"nodes": [...]}``
(:func:`placements_to_json`, :func:`placements_from_json`). A :class:`NodeType` is a kind of
node a cluster's autoscaler can launch, and :class:`Wants` what the scheduler asks it for
(chosen by :mod:`trainhouse.scheduler.capacity`, sent by the Ray executor). Standard library
only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Bundle",
    "Gpu",
    "Node",
    "NodeType",
    "Placement",
    "Placements",
    "Want",
    "Wants",
    "bundle_of",
    "placements_from_json",
    "placements_to_json",
]


@dataclass(frozen=True)
class Gpu:
    """One GPU a node offers.

    ``index`` is the number trainhouse schedules it by and labels its metrics with: NVML's
    index (PCI bus order) for a whole GPU; a MIG instance is numbered after the node's GPUs.
    ``uuid`` is what ``CUDA_VISIBLE_DEVICES`` names it by in a job: NVML's ``GPU-…`` or
    ``MIG-…`` UUID, for a declared GPU the entry of the server's own mask (empty: the index).
    ``parent`` is a MIG instance's GPU."""

    index: int
    model: str = "unknown"
    memory_bytes: int = 0
    uuid: str = ""
    parent: int | None = None

    @property
    def visible_id(self) -> str:
        """This GPU in a job's ``CUDA_VISIBLE_DEVICES``."""
        return self.uuid or str(self.index)


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_bytes: int
    gpus: tuple[Gpu, ...] = ()
    labels: tuple[str, ...] = ()  # custom resources a Ray node offers ("name=amount")
    held: tuple[str, ...] = ()  # why GPUs it has are not offered now (not in ``gpus`` then)

    def describe(self) -> str:
        gpu = f"{len(self.gpus)} GPU(s)" if self.gpus else "no GPUs"
        return f"node {self.name}: {self.cpus} CPU cores, {gpu}"

    def visible_ids(self, indices: Iterable[int]) -> list[str]:
        """The ``CUDA_VISIBLE_DEVICES`` entries of the GPUs with these indices, in that order
        (an index this node does not list stands for itself)."""
        by_index = {g.index: g.visible_id for g in self.gpus}
        return [by_index.get(i, str(i)) for i in indices]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Placement:
    """Where a job runs on one node: concrete GPU indices, a CPU count and its ranks there."""

    node: str
    cpus: int
    gpus: tuple[int, ...] = ()
    procs: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "cpus": self.cpus, "gpus": list(self.gpus), "procs": self.procs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        return cls(
            node=data["node"],
            cpus=int(data["cpus"]),
            gpus=tuple(data.get("gpus") or ()),
            procs=int(data.get("procs", 1)),
        )


#: A job's placement: one entry per node it spans, node rank order.
Placements = tuple[Placement, ...]


def placements_to_json(placements: Iterable[Placement]) -> dict[str, Any]:
    """As stored and as the API shows it: ``{"nodes": [{node, cpus, gpus, procs}, ...]}``."""
    return {"nodes": [p.to_dict() for p in placements]}


def placements_from_json(data: Mapping[str, Any] | None) -> Placements:
    """The placements of :func:`placements_to_json`'s form (none for ``None``)."""
    return tuple(Placement.from_dict(p) for p in (data or {}).get("nodes", []))


#: Resources one node's share of a job takes, as Ray names them (``{"CPU": 8.0, "GPU": 1.0}``).
Bundle = dict[str, float]


def bundle_of(cpus: int, gpus: int) -> Bundle:
    out = {"CPU": float(cpus)}
    if gpus:
        out["GPU"] = float(gpus)
    return out


@dataclass(frozen=True)
class NodeType:
    """A kind of node the cluster's autoscaler can launch: what one offers, at most how many
    may run at once (its ``max_workers``), and how many are in the cluster now."""

    name: str
    cpus: int
    gpus: int = 0
    max_workers: int = 0
    up: int = 0

    @property
    def room(self) -> int:
        """How many more the autoscaler may launch."""
        return max(self.max_workers - self.up, 0)

    def offers(self) -> str:
        gpu = f"{self.gpus} GPU(s)" if self.gpus else "no GPUs"
        return f"{self.name} ({self.cpus} CPU cores, {gpu})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Want:
    """A waiting job the autoscaler is asked to make room for: ``nodes`` new nodes of
    ``node_type``, and the bundles of every node of the job."""

    job: int
    node_type: str
    nodes: int
    bundles: tuple[Bundle, ...]


@dataclass(frozen=True)
class Wants:
    """What to ask the autoscaler for: the jobs (decision order), the bundles of what runs now
    (the autoscaler fits a request into the cluster's total resources, so what is busy must be
    in it for new nodes to come), and the jobs it cannot make room for, with why."""

    jobs: tuple[Want, ...] = ()
    held: tuple[Bundle, ...] = ()
    unmet: Mapping[int, str] = field(default_factory=dict)

    def keeping(self, before: Sequence[Want]) -> Wants:
        """These wants, with the asks of ``before`` kept for the jobs they found no room for: a
        node the autoscaler launched for a job shows in the cluster's resources a little after
        it shows as up, and one pass that sees it so must not withdraw what is being launched.
        A job placed, canceled or held by its quota is not among them: its ask goes."""
        kept = tuple(w for w in before if w.job in self.unmet)
        if not kept:
            return self
        gone = {w.job for w in kept}
        unmet = {job: why for job, why in self.unmet.items() if job not in gone}
        return Wants((*self.jobs, *kept), self.held, unmet)

    def bundles(self) -> list[Bundle]:
        """The request: nothing when no job wants a node (the autoscaler's idle timeout then
        lets unused nodes go)."""
        if not self.jobs:
            return []
        return [*self.held, *(b for w in self.jobs for b in w.bundles)]
