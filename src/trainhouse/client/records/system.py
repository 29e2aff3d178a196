"""Records of the server, its machines, environments and the scheduler's queue.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import Any, TypedDict

__all__ = [
    "Asked",
    "Autoscaler",
    "CapacityRequest",
    "Env",
    "Envs",
    "GpuLive",
    "Health",
    "Limits",
    "Node",
    "NodeEvent",
    "NodeType",
    "Nodes",
    "Pruned",
    "Queue",
    "QueueEntry",
    "Quotas",
    "SystemMetrics",
    "SystemSeries",
]


# -- the server and its machines -------------------------------------------------------------
class Health(TypedDict):
    """``HealthOut``: ``GET /health``."""

    status: str
    version: str
    home: str | None
    auth: bool


class GpuLive(TypedDict):
    """``GpuLiveOut``: a GPU's latest sample."""

    index: int
    util: float | None
    fb_used: float | None
    power: float | None
    temp: float | None


class Node(TypedDict):
    """``NodeOut``: a node, what it has free and its latest resource sample."""

    name: str
    cpus: int
    memory_bytes: int
    gpus: list[dict[str, Any]]
    free_cpus: int
    free_gpus: list[int]
    held: list[str]
    cpu_percent: float | None
    memory_used_bytes: int | None
    gpus_live: list[GpuLive]
    sampled_at: float | None


class NodeEvent(TypedDict):
    """``NodeEventOut``: a node that joined or left the cluster."""

    at: float
    node: str
    event: str
    node_type: str | None
    cpus: int
    gpus: int


class NodeType(TypedDict):
    """``NodeTypeOut``: a node type the cluster's autoscaler can launch."""

    name: str
    cpus: int
    gpus: int
    max_workers: int
    up: int


class Asked(TypedDict):
    """``AskedOut``: a waiting job the autoscaler is asked for."""

    job: int
    node_type: str
    nodes: int
    since: float


class CapacityRequest(TypedDict):
    """``CapacityRequestOut``: a request sent to the autoscaler."""

    at: float
    bundles: list[dict[str, float]]
    jobs: list[int]


class Autoscaler(TypedDict):
    """``AutoscalerOut``: the cluster's autoscaler and what was asked of it."""

    source: str
    node_types: list[NodeType]
    max_workers: int | None
    launching: dict[str, int]
    asked: list[Asked]
    requests: list[CapacityRequest]


class Nodes(TypedDict):
    """``NodesOut``: ``GET /nodes``."""

    executor: str
    nodes: list[Node]
    node_events: list[NodeEvent]
    autoscaler: Autoscaler | None


class SystemSeries(TypedDict):
    """``SystemSeriesOut``: a resource series, ``(at, value)`` points."""

    name: str
    gpu: int | None
    points: list[tuple[float, float]]
    max: list[float]


class SystemMetrics(TypedDict):
    """``SystemMetricsOut``: a node's or a job's resource series."""

    series: list[SystemSeries]


class Env(TypedDict):
    """``EnvOut``: a cached job environment."""

    digest: str
    size: int
    last_used: float
    in_use: bool
    jobs: list[str]


class Envs(TypedDict):
    """``EnvsOut``: the server machine's cache of job environments."""

    envs: list[Env]
    total_size: int
    max_size: int
    directory: str


class Pruned(TypedDict):
    """``PruneOut``: what pruning the environments removed."""

    removed: list[Env]
    kept_in_use: list[str]


# -- the scheduler ---------------------------------------------------------------------------
class QueueEntry(TypedDict):
    """``QueueEntry``: a waiting job and why it waits."""

    position: int
    id: int
    name: str
    owner: str
    priority: str
    created_at: float
    reason: str | None


class Queue(TypedDict):
    """``QueueOut``: ``GET /queue``."""

    jobs: list[QueueEntry]
    preempting: list[dict[str, Any]]


class Limits(TypedDict):
    """``LimitsOut``: a user's caps, weight and usage."""

    owner: str
    share: float
    max_gpus: int | None
    max_cpus: int | None
    usage: float


class Quotas(TypedDict):
    """``QuotasOut``: ``GET /quotas``."""

    default_max_gpus: int | None
    default_max_cpus: int | None
    half_life_seconds: float
    users: list[Limits]
