"""Health, the node inventory and the job spec's JSON Schema."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from trainhouse._version import __version__
from trainhouse.scheduler.policy import free_capacity
from trainhouse.server.deps import Services, services
from trainhouse.server.schemas import HealthOut, NodeOut, NodesOut
from trainhouse.spec import json_schema

router = APIRouter(tags=["system"])


@router.get("/health", response_model=HealthOut)
def health(svc: Services = Depends(services)) -> HealthOut:
    return HealthOut(status="ok", version=__version__, home=str(svc.settings.home))


@router.get("/nodes", response_model=NodesOut)
def nodes(svc: Services = Depends(services)) -> NodesOut:
    snap, _ = svc.scheduler.snapshot()
    free = free_capacity(snap.nodes, snap.running)
    return NodesOut(
        executor=svc.settings.executor,
        nodes=[
            NodeOut(
                name=n.name,
                cpus=n.cpus,
                memory_bytes=n.memory_bytes,
                gpus=[
                    {"index": g.index, "model": g.model, "memory_bytes": g.memory_bytes}
                    for g in n.gpus
                ],
                free_cpus=free[n.name].cpus,
                free_gpus=sorted(free[n.name].gpus),
            )
            for n in snap.nodes
        ],
    )


@router.get("/spec/schema")
def spec_schema() -> dict[str, Any]:
    return json_schema()
