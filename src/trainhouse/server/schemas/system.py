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


class NodesOut(BaseModel):
    executor: str
    nodes: list[NodeOut]


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
