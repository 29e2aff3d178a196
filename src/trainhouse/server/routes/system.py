"""Health, the node inventory with its latest resource sample, resource series of nodes and
jobs, the job spec's JSON Schema, and the Prometheus exposition (``GET /metrics``). The work
is :mod:`trainhouse.usecases.system`'s; these routes parse, call and render."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from trainhouse import __version__
from trainhouse.core.records import Job
from trainhouse.core.spec import json_schema
from trainhouse.server.auth import readable_job, signed_in
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    HealthOut,
    NodeOut,
    NodesOut,
    NulFree,
    SystemMetricsOut,
    SystemSeriesOut,
)
from trainhouse.usecases import system
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["system"])
exposition = APIRouter(tags=["system"])  # mounted at the root, not under /api/v1

Since = Query(
    None,
    description="Unix time of the first sample; negative: that many seconds before now",
)
Until = Query(None, description="Unix time of the last sample; negative: seconds before now")
MaxPoints = Query(
    system.DEFAULT_MAX_POINTS,
    ge=1,
    le=100_000,
    description="More samples than this in a series are averaged into time buckets",
)


def _series_out(series: list[system.Series]) -> SystemMetricsOut:
    return SystemMetricsOut(
        series=[SystemSeriesOut(name=s.name, gpu=s.gpu, points=s.points, max=s.max) for s in series]
    )


@router.get("/health", response_model=HealthOut)
def health(rt: Runtime = Depends(runtime)) -> HealthOut:
    """Open to anyone (load balancers); with auth on it does not say where state lives."""
    home = None if rt.auth.enabled else str(rt.settings.home)
    return HealthOut(status="ok", version=__version__, home=home, auth=rt.auth.enabled)


@router.get("/nodes", response_model=NodesOut)
def nodes(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> NodesOut:
    return NodesOut(
        executor=rt.settings.executor,
        nodes=[NodeOut(**n) for n in system.nodes(rt)],
        **system.cluster(rt),
    )


@router.get("/nodes/{node}/metrics", response_model=SystemMetricsOut)
def node_metrics(
    node: str,
    name: list[NulFree] | None = Query(None, description="Only these series (repeatable)"),
    since: float | None = Since,
    until: float | None = Until,
    max_points: int = MaxPoints,
    _p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> SystemMetricsOut:
    """A node's resource series (the last hour by default): cpu_percent, memory_used_bytes,
    memory_total_bytes and, per GPU, DCGM_FI_DEV_GPU_UTIL, _FB_USED, _FB_FREE, _POWER_USAGE,
    _GPU_TEMP."""
    return _series_out(
        system.node_series(rt, node, names=name, since=since, until=until, max_points=max_points)
    )


@router.get("/jobs/{job_id}/system", response_model=SystemMetricsOut)
def job_system(
    job: Job = Depends(readable_job),
    since: float | None = Since,
    until: float | None = Until,
    max_points: int = MaxPoints,
    rt: Runtime = Depends(runtime),
) -> SystemMetricsOut:
    """A job's resource series (all of them by default): its processes' cpu_percent (of one
    core), rss_bytes, processes, and gpu_memory_bytes per GPU."""
    return _series_out(system.job_series(rt, job, since=since, until=until, max_points=max_points))


@router.get("/spec/schema")
def spec_schema() -> dict[str, Any]:
    return json_schema()


@exposition.get("/metrics", include_in_schema=False)
def prometheus(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> Response:
    """Prometheus' text exposition of the server's metrics (see trainhouse.monitoring.telemetry)."""
    return Response(system.exposition(rt), media_type=CONTENT_TYPE_LATEST)
