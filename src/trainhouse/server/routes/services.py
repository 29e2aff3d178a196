"""Services: a model version served by a long-running job of replicas.

Everyone signed in lists services and predicts (viewers too); members and admins start them,
and a service's owner or an admin stops it. A service's replicas (the ranks of its job) call in
with their job's credential: ``POST /jobs/{id}/replicas`` says where a replica listens and
answers what it should serve; the files and code of that version come from the routes below it.
The work is :mod:`trainhouse.usecases.services`'s (the replicas themselves,
:mod:`trainhouse.usecases.replicahub`'s); these routes parse, call and render.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from trainhouse.core.modelrecord import TensorSpec
from trainhouse.core.records import Job
from trainhouse.core.spec import Priority
from trainhouse.server.auth import reporting_job, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.models import FileName, VersionNo
from trainhouse.usecases import services
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.services import empty_archive as empty_archive  # tests import it here

router = APIRouter(tags=["services"])

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ServiceName = Annotated[str, Path(pattern=NAME, description="A service's name")]
MAX_REPLICAS = 64


class ServiceIn(BaseModel):
    """``trainhouse serve NAME@REF``: what to serve and how."""

    model: str = Field(pattern=NAME, description="The model's name")
    ref: str = Field(
        "latest",
        pattern=NAME,
        description="What it follows: an alias (the service moves when the alias does), "
        "latest, or a version number",
    )
    name: str | None = Field(None, pattern=NAME, description="The service's name (the model's)")
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    gpus_per_replica: int = Field(0, ge=0, le=1, description="0 (CPU) or 1 GPU per replica")
    max_batch: int = Field(32, ge=1, le=1024, description="Examples in one batch at most")
    max_wait_ms: float = Field(
        5.0, ge=0, le=1000, description="How long a batch waits for more after its first"
    )
    priority: Priority = "normal"
    owner: str = Field(
        "anonymous", max_length=128, pattern=r"^[^\x00]*$", description="Ignored with auth on"
    )


class ReplicaStats(BaseModel):
    requests: int = Field(0, ge=0, le=2**62)
    batches: int = Field(0, ge=0, le=2**62)
    examples: int = Field(0, ge=0, le=2**62)


class ReplicaIn(BaseModel):
    """A replica's call: where it listens and what it serves."""

    rank: int = Field(ge=0, lt=MAX_REPLICAS)
    url: str = Field(min_length=1, max_length=256)
    key: str = Field(min_length=16, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    version: int | None = Field(None, ge=1, le=2**31 - 1)
    state: Literal["loading", "ready", "failed"]
    error: str | None = Field(None, max_length=2000)
    stats: ReplicaStats = Field(default_factory=ReplicaStats)
    outputs: list[TensorSpec] | None = Field(
        None,
        max_length=16,
        description="What the model of version answers (the replica ran it as it loaded it): "
        "recorded as that version's outputs when its signature has none",
    )


class ReplicaOut(BaseModel):
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


class LatencyOut(BaseModel):
    p50: float | None
    p95: float | None
    p99: float | None


class ServiceStatsOut(BaseModel):
    requests_total: int
    errors_total: int
    requests_per_s: float
    errors_per_s: float
    latency_ms: LatencyOut
    mean_batch: float | None
    window_s: float


class ServiceOut(BaseModel):
    name: str
    owner: str
    model: str
    ref: str
    target_version: int | None = Field(description="The version its ref names now")
    problem: str | None = Field(description="Why its ref names no version, if it does not")
    version: int | None = Field(description="The version every ready replica serves")
    versions: list[int] = Field(description="The versions its ready replicas serve")
    state: str = Field(description="queued, starting, ready, degraded, stopping, stopped, failed")
    replicas: int
    ready_replicas: int
    replica_list: list[ReplicaOut]
    gpus_per_replica: int
    max_batch: int
    max_wait_ms: float
    priority: str
    job_id: int | None
    job_state: str | None
    created_at: float
    updated_at: float
    stats: ServiceStatsOut


class ServiceListOut(BaseModel):
    services: list[ServiceOut]


@router.get("/services", response_model=ServiceListOut)
def list_services(
    _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> ServiceListOut:
    return ServiceListOut(services=[ServiceOut(**s) for s in services.services(rt)])


@router.post("/services", response_model=ServiceOut, status_code=201)
def start_service(
    body: ServiceIn,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ServiceOut:
    """Start serving ``model@ref``: a long-running job of ``replicas`` ranks that the scheduler
    places like any job (priority, GPUs, quotas; restarted when a replica dies)."""
    started = services.start(
        rt,
        p,
        model=body.model,
        ref=body.ref,
        name=body.name,
        replicas=body.replicas,
        gpus_per_replica=body.gpus_per_replica,
        max_batch=body.max_batch,
        max_wait_ms=body.max_wait_ms,
        priority=body.priority,
        owner=body.owner,
    )
    return ServiceOut(**started)


@router.get("/services/{name}", response_model=ServiceOut)
def show_service(
    name: ServiceName, _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> ServiceOut:
    return ServiceOut(**services.show(rt, name))


@router.post("/services/{name}/stop", response_model=ServiceOut)
def stop_service(
    name: ServiceName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ServiceOut:
    """Stop a service: its job is canceled (its replicas get SIGTERM, then SIGKILL)."""
    return ServiceOut(**services.stop(rt, p, name))


@router.post(
    "/services/{name}/predict",
    responses={200: {"description": '{"outputs": [...], "model": NAME, "version": V}'}},
)
async def predict(
    request: Request,
    name: ServiceName,
    _p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> Response:
    """Predict: ``{"inputs": [...]}`` (one entry per example; or ``{"inputs": {"x": [...],
    ...}}`` for a model of several inputs) answers ``{"outputs": [...], "model": NAME,
    "version": V}``, batched with other clients' requests on one replica.

    The app answers this before routing (:mod:`trainhouse.server.predict`, the same checks
    and forwarding at a fraction of the cost); the route documents the operation and answers
    only in an app built without that path."""
    body = await request.body()
    status, content, headers = await services.predict(rt, name, body)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


# -- what the replicas call, with their job's credential ---------------------------------------
@router.post("/jobs/{job_id}/replicas")
def replica_heartbeat(
    body: ReplicaIn, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> dict[str, Any]:
    """A replica says where it listens and what it serves; the answer is what its service
    should serve now (``version`` null while its ref names none)."""
    return services.heartbeat(
        rt,
        job,
        rank=body.rank,
        url=body.url,
        key=body.key,
        version=body.version,
        state=body.state,
        error=body.error,
        stats=body.stats.model_dump(),
        outputs=None if body.outputs is None else [o.model_dump() for o in body.outputs],
    )


@router.get("/jobs/{job_id}/replicas/versions/{version}/files/{file}")
def replica_file(
    version: VersionNo,
    file: FileName,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """One file of a version of the service's model (the replica checks its sha256)."""
    return StreamingResponse(
        services.replica_file(rt, job, version, file), media_type="application/octet-stream"
    )


@router.get("/jobs/{job_id}/replicas/versions/{version}/code")
def replica_code(
    version: VersionNo, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> FileResponse:
    """The workdir archive of the job that made a version: the code its loader lives in."""
    return FileResponse(services.replica_code(rt, job, version), media_type="application/gzip")
