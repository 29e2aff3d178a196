"""Records of the model registry and of the services that serve its versions.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import Any, TypedDict

from trainhouse.client.records.jobs import Promotion

__all__ = [
    "Latency",
    "Model",
    "ModelDetail",
    "ModelFile",
    "ModelList",
    "ModelVersion",
    "PromotionRecord",
    "Replica",
    "Service",
    "ServiceList",
    "ServiceStats",
]


# -- the model registry ----------------------------------------------------------------------
class ModelFile(TypedDict):
    """``ModelFileOut``: a file of a model version."""

    name: str
    size: int
    sha256: str


class ModelVersion(TypedDict):
    """``ModelVersionOut``: a version of a model."""

    model: str
    version: int
    job_id: int | None
    attempt: int
    step: int
    kind: str
    files: list[ModelFile]
    size: int
    metrics: dict[str, float | None]
    signature: dict[str, Any]
    record: dict[str, Any]
    created_at: float
    aliases: list[str]


class Model(TypedDict):
    """``ModelOut``: a model, its version count, newest version and aliases."""

    name: str
    owner: str
    created_at: float
    versions: int
    latest: int | None
    aliases: dict[str, int]


class ModelList(TypedDict):
    """``ModelListOut``: ``GET /models``."""

    models: list[Model]


class PromotionRecord(Promotion):
    """``PromotionRecordOut``: a decision a job's promote: made (``ModelDetail.promotions``)."""

    job_id: int


class ModelDetail(TypedDict):
    """``ModelDetailOut``: a model, its versions, promotions and the jobs that read them."""

    model: Model
    versions: list[ModelVersion]
    promotions: list[PromotionRecord]
    readers: dict[str, list[int]]


# -- services --------------------------------------------------------------------------------
class Replica(TypedDict):
    """``ReplicaOut``: a replica of a service (a rank of its job)."""

    rank: int
    attempt: int
    url: str
    version: int | None
    state: str
    error: str | None
    last_seen: float
    started_at: float
    requests: int
    batches: int
    examples: int


class Latency(TypedDict):
    """``LatencyOut``: latency percentiles, in milliseconds."""

    p50: float | None
    p95: float | None
    p99: float | None


class ServiceStats(TypedDict):
    """``ServiceStatsOut``: a service's recent traffic."""

    requests_total: int
    errors_total: int
    requests_per_s: float
    errors_per_s: float
    latency_ms: Latency
    mean_batch: float | None
    window_s: float


class Service(TypedDict):
    """``ServiceOut``: a service, its replicas and its traffic."""

    name: str
    owner: str
    model: str
    ref: str
    target_version: int | None
    problem: str | None
    version: int | None
    versions: list[int]
    state: str
    replicas: int
    ready_replicas: int
    replica_list: list[Replica]
    gpus_per_replica: int
    max_batch: int
    max_wait_ms: float
    priority: str
    job_id: int | None
    job_state: str | None
    created_at: float
    updated_at: float
    stats: ServiceStats


class ServiceList(TypedDict):
    """``ServiceListOut``: ``GET /services``."""

    services: list[Service]
