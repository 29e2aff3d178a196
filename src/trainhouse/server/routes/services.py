"""Runtime: a model version served by a long-running job of replicas.

Everyone signed in lists services and predicts (viewers too); members and admins start them,
and a service's owner or an admin stops it. A service's replicas (the ranks of its job) call in
with their job's credential: ``POST /jobs/{id}/replicas`` says where a replica listens and
answers what it should serve; the files and code of that version come from the routes below it.
See :mod:`trainhouse.usecases.replicahub`.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from trainhouse.core.errors import Forbidden, NotFound, ResourceError
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.spec import Priority
from trainhouse.server.auth import audit, reporting_job, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import check_priority, owner_of, schedulable_spec
from trainhouse.server.routes.models import FileName, VersionNo
from trainhouse.store import Job, ServiceRecord
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["services"])

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ServiceName = Annotated[str, Path(pattern=NAME, description="A service's name")]
MAX_REPLICAS = 64
#: what a service's job runs: each rank is one replica (trainhouse.serving.follow)
ENTRYPOINT = "python -m trainhouse.serving.follow"
SERVICE_RESTARTS = 20  # a crashed replica's job starts again this many times


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


def service_out(rt: Runtime, service: ServiceRecord) -> ServiceOut:
    job = None
    if service.job_id is not None:
        try:
            job = rt.store.jobs.get(service.job_id)
        except NotFound:
            job = None
    return ServiceOut(**rt.replicas.describe(service, job))


def empty_archive(rt: Runtime) -> str:
    """The digest of an empty workdir archive (a service's job runs no uploaded code)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w"):
        pass
    raw.seek(0)
    digest, _ = rt.blobs.put(raw, 1 << 20)
    return digest


@router.get("/services", response_model=ServiceListOut)
def list_services(
    _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> ServiceListOut:
    return ServiceListOut(services=[service_out(rt, s) for s in rt.store.services.list()])


@router.post("/services", response_model=ServiceOut, status_code=201)
def start_service(
    request: Request,
    body: ServiceIn,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ServiceOut:
    """Start serving ``model@ref``: a long-running job of ``replicas`` ranks that the scheduler
    places like any job (priority, GPUs, quotas; restarted when a replica dies)."""
    name = body.name or body.model
    version = rt.store.models.resolve(body.model, body.ref)  # 404 naming what is missing
    check_priority(p, body.priority)
    spec_data: dict[str, Any] = {
        "name": f"serve-{name}"[:128],
        "entrypoint": ENTRYPOINT,
        "project": "services",
        "tags": ["service"],
        "priority": body.priority,
        "max_restarts": SERVICE_RESTARTS,
        "resources": {
            "nodes": 1,
            "procs_per_node": body.replicas,
            "gpus_per_node": body.replicas * body.gpus_per_replica,
        },
        "env": {"OMP_NUM_THREADS": "1"},
    }
    try:
        spec = schedulable_spec(orjson.dumps(spec_data).decode(), rt, source="the service's job")
    except ResourceError as exc:
        raise ResourceError(
            f"service {name} ({body.replicas} replicas, {body.gpus_per_replica} GPU each) "
            f"{str(exc).removeprefix('job ')}"
        ) from None
    owner = owner_of(p, body.owner)
    service = rt.store.services.create(
        name=name,
        owner=owner,
        model=body.model,
        ref=body.ref,
        replicas=body.replicas,
        gpus_per_replica=body.gpus_per_replica,
        max_batch=body.max_batch,
        max_wait_ms=body.max_wait_ms,
        priority=body.priority,
        spec=spec,
        archive_sha256=empty_archive(rt),
    )
    rt.replicas.forget(name)
    rt.scheduler.wake()
    audit(
        rt,
        request,
        p,
        "service.start",
        f"service:{name}",
        model=body.model,
        ref=body.ref,
        version=version.version,
        job=service.job_id,
    )
    return service_out(rt, service)


@router.get("/services/{name}", response_model=ServiceOut)
def show_service(
    name: ServiceName, _p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> ServiceOut:
    return service_out(rt, rt.store.services.get(name))


@router.post("/services/{name}/stop", response_model=ServiceOut)
def stop_service(
    request: Request,
    name: ServiceName,
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> ServiceOut:
    """Stop a service: its job is canceled (its replicas get SIGTERM, then SIGKILL)."""
    service = rt.store.services.get(name)
    if p.authenticated and not p.is_admin and service.owner != p.name:
        raise Forbidden(f"service {name} belongs to {service.owner}; {p.name!r} may not stop it")
    if service.job_id is not None:
        try:
            job = rt.store.jobs.get(service.job_id)
        except NotFound:
            job = None
        if job is not None and job.state not in TERMINAL:
            rt.store.jobs.request_cancel(job.id)
            rt.scheduler.wake()
    service = rt.store.services.set_stopped(name)
    rt.replicas.forget(name)
    audit(rt, request, p, "service.stop", f"service:{name}", job=service.job_id)
    return service_out(rt, service)


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
    "version": V}``, batched with other clients' requests on one replica."""
    body = await request.body()
    status, content, headers = await rt.replicas.predict(name, body)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


# -- what the replicas call, with their job's credential ---------------------------------------
@router.post("/jobs/{job_id}/replicas")
def replica_heartbeat(
    body: ReplicaIn, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> dict[str, Any]:
    """A replica says where it listens and what it serves; the answer is what its service
    should serve now (``version`` null while its ref names none)."""
    hosts = {p.node for p in job.placement}
    return rt.replicas.heartbeat(
        job,
        rank=body.rank,
        url=body.url,
        key=body.key,
        version=body.version,
        state=body.state,
        error=body.error,
        stats=body.stats.model_dump(),
        allowed_hosts=hosts,
    )


def _served_version(rt: Runtime, job: Job, version: int) -> Any:
    service = rt.store.services.of_job(job.id)
    if service is None:
        raise NotFound(f"job {job.id} runs no service")
    return rt.store.models.version(service.model, version)


@router.get("/jobs/{job_id}/replicas/versions/{version}/files/{file}")
def replica_file(
    version: VersionNo,
    file: FileName,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """One file of a version of the service's model (the replica checks its sha256)."""
    found = _served_version(rt, job, version)
    return StreamingResponse(
        rt.saved_models.read(found, file), media_type="application/octet-stream"
    )


@router.get("/jobs/{job_id}/replicas/versions/{version}/code")
def replica_code(
    version: VersionNo, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> FileResponse:
    """The workdir archive of the job that made a version: the code its loader lives in."""
    found = _served_version(rt, job, version)
    if found.job_id is None:
        raise NotFound(f"{found.model}@{found.version}'s job is deleted, with its code")
    source = rt.store.jobs.get(found.job_id)
    archive = rt.blobs.path(source.archive_sha256)
    if not archive.is_file():
        raise NotFound(f"job {source.id}'s workdir archive is no longer on the server")
    return FileResponse(archive, media_type="application/gzip")
