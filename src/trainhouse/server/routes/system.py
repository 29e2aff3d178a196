"""Health, the node inventory with its latest resource sample, resource series of nodes and
jobs, the job spec's JSON Schema, and the Prometheus exposition (``GET /metrics``)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from trainhouse import __version__
from trainhouse.core import metricnames as names
from trainhouse.core.errors import NotFound
from trainhouse.core.spec import json_schema
from trainhouse.scheduler.policy import free_capacity
from trainhouse.server.auth import readable_job, signed_in
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    GpuLiveOut,
    HealthOut,
    NodeOut,
    NodesOut,
    NulFree,
    SystemMetricsOut,
    SystemSeriesOut,
)
from trainhouse.store import Job
from trainhouse.store.system import DEFAULT_MAX_POINTS, Latest, Series
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["system"])
exposition = APIRouter(tags=["system"])  # mounted at the root, not under /api/v1

NODE_DEFAULT_SPAN = 3600.0  # a node's series: the last hour unless ``since`` says otherwise

Since = Query(
    None,
    description="Unix time of the first sample; negative: that many seconds before now",
)
Until = Query(None, description="Unix time of the last sample; negative: seconds before now")
MaxPoints = Query(
    DEFAULT_MAX_POINTS,
    ge=1,
    le=100_000,
    description="More samples than this in a series are averaged into time buckets",
)


def _when(value: float | None, now: float) -> float | None:
    return now + value if value is not None and value < 0 else value


def _series_out(series: list[Series]) -> SystemMetricsOut:
    return SystemMetricsOut(
        series=[SystemSeriesOut(name=s.name, gpu=s.gpu, points=s.points, max=s.max) for s in series]
    )


def _live(latest: Latest | None) -> dict[str, Any]:
    if latest is None:
        return {}
    used = latest.value(names.MEMORY_USED)
    return {
        "cpu_percent": latest.value(names.CPU_PERCENT),
        "memory_used_bytes": int(used) if used is not None else None,
        "gpus_live": [
            GpuLiveOut(
                index=i,
                util=latest.value(names.GPU_UTIL, i),
                fb_used=latest.value(names.FB_USED, i),
                power=latest.value(names.POWER_USAGE, i),
                temp=latest.value(names.GPU_TEMP, i),
            )
            for i in latest.gpus()
        ],
        "sampled_at": latest.at,
    }


@router.get("/health", response_model=HealthOut)
def health(rt: Runtime = Depends(runtime)) -> HealthOut:
    """Open to anyone (load balancers); with auth on it does not say where state lives."""
    home = None if rt.auth.enabled else str(rt.settings.home)
    return HealthOut(status="ok", version=__version__, home=home, auth=rt.auth.enabled)


@router.get("/nodes", response_model=NodesOut)
def nodes(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> NodesOut:
    snap, _ = rt.scheduler.snapshot()
    free = free_capacity(snap.nodes, snap.running)
    return NodesOut(
        executor=rt.settings.executor,
        nodes=[
            NodeOut(
                name=n.name,
                cpus=n.cpus,
                memory_bytes=n.memory_bytes,
                gpus=[
                    {
                        "index": g.index,
                        "model": g.model,
                        "memory_bytes": g.memory_bytes,
                        "uuid": g.uuid or None,
                        "parent": g.parent,
                    }
                    for g in n.gpus
                ],
                free_cpus=free[n.name].cpus,
                free_gpus=sorted(free[n.name].gpus),
                held=list(n.held),
                **_live(rt.store.system.latest(node=n.name)),
            )
            for n in snap.nodes
        ],
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
    known = [n.name for n in rt.scheduler.executor.nodes()]
    if node not in known:
        raise NotFound(f"node {node!r} does not exist; nodes: {', '.join(known)}")
    now = time.time()
    start = _when(since, now)
    return _series_out(
        rt.store.system.series(
            node=node,
            names=name or None,
            since=now - NODE_DEFAULT_SPAN if start is None else start,
            until=_when(until, now),
            max_points=max_points,
        )
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
    now = time.time()
    return _series_out(
        rt.store.system.series(
            job_id=job.id,
            since=_when(since, now),
            until=_when(until, now),
            max_points=max_points,
        )
    )


@router.get("/spec/schema")
def spec_schema() -> dict[str, Any]:
    return json_schema()


@exposition.get("/metrics", include_in_schema=False)
def prometheus(_p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> Response:
    """Prometheus' text exposition of the server's metrics (see trainhouse.monitoring.telemetry)."""
    return Response(rt.telemetry.render(), media_type=CONTENT_TYPE_LATEST)
