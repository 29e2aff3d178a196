"""The bodies of the system routes: health, the nodes with their latest resource sample,
and the resource series of a node or a job."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class GpuLiveOut(BaseModel):
    index: int
    util: float | None = Field(None, description="DCGM_FI_DEV_GPU_UTIL, %")
    fb_used: float | None = Field(None, description="DCGM_FI_DEV_FB_USED, MiB")
    power: float | None = Field(None, description="DCGM_FI_DEV_POWER_USAGE, W")
    temp: float | None = Field(None, description="DCGM_FI_DEV_GPU_TEMP, C")


class NodeOut(BaseModel):
    name: str
    cpus: int
    memory_bytes: int
    gpus: list[dict[str, Any]]
    free_cpus: int
    free_gpus: list[int]
    held: list[str] = Field(
        default_factory=list, description="Why GPUs of the node are not offered now"
    )
    # the latest resource sample (null/empty when the node has none)
    cpu_percent: float | None = Field(None, description="Of all cores, 0-100")
    memory_used_bytes: int | None = Field(None, description="Total minus available")
    gpus_live: list[GpuLiveOut] = Field(
        default_factory=list, description="Per GPU NVML sees; empty without NVIDIA's driver"
    )
    sampled_at: float | None = None


class NodeEventOut(BaseModel):
    at: float
    node: str
    event: str = Field(description="joined or left")
    node_type: str | None = Field(None, description="The autoscaler's node type, when known")
    cpus: int
    gpus: int


class NodeTypeOut(BaseModel):
    name: str
    cpus: int
    gpus: int
    max_workers: int = Field(description="At most this many at once")
    up: int = Field(description="How many are in the cluster now")


class AskedOut(BaseModel):
    job: int
    node_type: str
    nodes: int = Field(description="New nodes it waits for (0: room on a node asked for before)")
    since: float


class CapacityRequestOut(BaseModel):
    at: float
    bundles: list[dict[str, float]] = Field(description="Empty: the request was withdrawn")
    jobs: list[int]


class AutoscalerOut(BaseModel):
    source: str = Field(description="Where the node types were read from")
    node_types: list[NodeTypeOut]
    max_workers: int | None = Field(None, description="The cluster's cap on worker nodes")
    launching: dict[str, int] = Field(description="Nodes of each type being launched")
    asked: list[AskedOut] = Field(description="The waiting jobs asked for now")
    requests: list[CapacityRequestOut] = Field(description="The last requests, oldest first")


class NodesOut(BaseModel):
    executor: str
    nodes: list[NodeOut]
    node_events: list[NodeEventOut] = Field(
        default_factory=list, description="Nodes that joined or left lately, oldest first"
    )
    autoscaler: AutoscalerOut | None = Field(
        None, description="The cluster's autoscaler and what was asked of it (none: no autoscaler)"
    )


class HealthOut(BaseModel):
    status: str
    version: str
    home: str | None = Field(None, description="The server's state directory (auth off only)")
    auth: bool = Field(False, description="Whether the server checks tokens")


class SystemSeriesOut(BaseModel):
    name: str
    gpu: int | None = Field(None, description="The GPU's index, for per-GPU values")
    points: list[tuple[float, float]] = Field(
        description="[at, value]: unix time and value, or a time bucket's averages"
    )
    max: list[float] = Field(description="Each point's maximum (its value when not averaged)")


class SystemMetricsOut(BaseModel):
    series: list[SystemSeriesOut]
