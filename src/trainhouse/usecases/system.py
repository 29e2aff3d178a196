"""The cluster as the server sees it: the node inventory with what is free and each node's
latest resource sample, the resource series of nodes and jobs (the sampler's,
:mod:`trainhouse.monitoring.sampler`), and the Prometheus exposition of the server's own
metrics (:mod:`trainhouse.monitoring.telemetry`). Reads only: nothing here is audited."""

from __future__ import annotations

import time
from typing import Any

from trainhouse.core import metricnames
from trainhouse.core.errors import NotFound
from trainhouse.core.records import Job
from trainhouse.scheduler.policy import free_capacity
from trainhouse.store.system import DEFAULT_MAX_POINTS, Latest, Series
from trainhouse.usecases.runtime import Runtime

NODE_DEFAULT_SPAN = 3600.0  # a node's series: the last hour unless ``since`` says otherwise

__all__ = [
    "DEFAULT_MAX_POINTS",
    "NODE_DEFAULT_SPAN",
    "Series",
    "cluster",
    "exposition",
    "job_series",
    "node_series",
    "nodes",
]


def _when(value: float | None, now: float) -> float | None:
    """A time as asked: negative means that many seconds before ``now``."""
    return now + value if value is not None and value < 0 else value


def _live(latest: Latest | None) -> dict[str, Any]:
    """The fields of a node's latest sample (none when it has none)."""
    if latest is None:
        return {}
    used = latest.value(metricnames.MEMORY_USED)
    return {
        "cpu_percent": latest.value(metricnames.CPU_PERCENT),
        "memory_used_bytes": int(used) if used is not None else None,
        "gpus_live": [
            {
                "index": i,
                "util": latest.value(metricnames.GPU_UTIL, i),
                "fb_used": latest.value(metricnames.FB_USED, i),
                "power": latest.value(metricnames.POWER_USAGE, i),
                "temp": latest.value(metricnames.GPU_TEMP, i),
            }
            for i in latest.gpus()
        ],
        "sampled_at": latest.at,
    }


def nodes(rt: Runtime) -> list[dict[str, Any]]:
    """The scheduler's nodes as the API shows them (the fields of ``NodeOut``): their CPUs,
    memory and GPUs, what is free of them now, why GPUs are held back, and their latest
    resource sample."""
    snap, _ = rt.scheduler.snapshot()
    free = free_capacity(snap.nodes, snap.running)
    return [
        {
            "name": n.name,
            "cpus": n.cpus,
            "memory_bytes": n.memory_bytes,
            "gpus": [
                {
                    "index": g.index,
                    "model": g.model,
                    "memory_bytes": g.memory_bytes,
                    "uuid": g.uuid or None,
                    "parent": g.parent,
                }
                for g in n.gpus
            ],
            "free_cpus": free[n.name].cpus,
            "free_gpus": sorted(free[n.name].gpus),
            "held": list(n.held),
            **_live(rt.store.system.latest(node=n.name)),
        }
        for n in snap.nodes
    ]


def cluster(rt: Runtime) -> dict[str, Any]:
    """What an executor that watches its cluster says of it (the fields of ``NodesOut`` past
    the nodes): the nodes that joined and left lately, and the cluster's autoscaler with what
    was asked of it (the Ray executor's ``cluster_view``; nothing for the local one)."""
    view = getattr(rt.scheduler.executor, "cluster_view", None)
    if not callable(view):
        return {}
    return dict(view())


def node_series(
    rt: Runtime,
    node: str,
    *,
    names: list[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """A node's resource series (only ``names``, when given), from ``since`` (by default an
    hour ago) to ``until``; negative times count back from now. 404 for a node the executor
    does not have."""
    known = [n.name for n in rt.scheduler.executor.nodes()]
    if node not in known:
        raise NotFound(f"node {node!r} does not exist; nodes: {', '.join(known)}")
    now = time.time()
    start = _when(since, now)
    return rt.store.system.series(
        node=node,
        names=names or None,
        since=now - NODE_DEFAULT_SPAN if start is None else start,
        until=_when(until, now),
        max_points=max_points,
    )


def job_series(
    rt: Runtime,
    job: Job,
    *,
    since: float | None = None,
    until: float | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> list[Series]:
    """A job's resource series (all of them by default); negative times count back from
    now."""
    now = time.time()
    return rt.store.system.series(
        job_id=job.id, since=_when(since, now), until=_when(until, now), max_points=max_points
    )


def exposition(rt: Runtime) -> bytes:
    """The server's metrics in Prometheus' text exposition format."""
    return rt.telemetry.render()
