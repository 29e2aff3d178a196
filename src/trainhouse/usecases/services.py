"""Services: a model version served by a long-running job of replicas. Start, list, show,
stop and predict; and what a service's replicas call with their job's credential.

Everyone signed in lists services and predicts (viewers too); members and admins start them,
and a service's owner or an admin stops it (the routes' dependencies check the role; these
use cases, the owner). A start and a stop are each one transaction with their audit entry. The
replicas themselves are :mod:`trainhouse.usecases.replicahub`'s.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from trainhouse.core.errors import Forbidden, NotFound, ResourceError
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.records import Job, ModelVersion, ServiceRecord
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.replicahub import Reach
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import check_priority, owner_of, schedulable_spec

__all__ = [
    "ENTRYPOINT",
    "SERVICE_RESTARTS",
    "empty_archive",
    "heartbeat",
    "predict",
    "replica_code",
    "replica_file",
    "services",
    "show",
    "start",
    "stop",
    "view",
]

#: what a service's job runs: each rank is one replica (trainhouse.serving.follow)
ENTRYPOINT = "python -m trainhouse.serving.follow"
SERVICE_RESTARTS = 20  # a crashed replica's job starts again this many times


def view(rt: Runtime, service: ServiceRecord) -> dict[str, Any]:
    """A service as the API shows it (the fields of ``ServiceOut``): with its job's state and
    its replicas as their last calls described them."""
    job = None
    if service.job_id is not None:
        try:
            job = rt.store.jobs.get(service.job_id)
        except NotFound:
            job = None
    return rt.replicas.describe(service, job)


def empty_archive(rt: Runtime) -> str:
    """The digest of an empty workdir archive (a service's job runs no uploaded code)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w"):
        pass
    raw.seek(0)
    digest, _ = rt.blobs.put(raw, 1 << 20)
    return digest


def services(rt: Runtime) -> list[dict[str, Any]]:
    """Every service, as the API shows it."""
    return [view(rt, s) for s in rt.store.services.list()]


def show(rt: Runtime, name: str) -> dict[str, Any]:
    """The service ``name`` (404 if there is none)."""
    return view(rt, rt.store.services.get(name))


def start(
    rt: Runtime,
    p: Principal,
    *,
    model: str,
    ref: str,
    name: str | None,
    replicas: int,
    gpus_per_replica: int,
    max_batch: int,
    max_wait_ms: float,
    priority: str,
    owner: str,
) -> dict[str, Any]:
    """Start serving ``model@ref`` as ``name`` (default: the model's): a long-running job of
    ``replicas`` ranks that the scheduler places like any job (priority, GPUs, quotas;
    restarted when a replica dies). Refused (404) when ``ref`` names no version, (409) while a
    service of that name runs, (422) when its job could never run here."""
    name = name or model
    version = rt.store.models.resolve(model, ref)  # 404 naming what is missing
    check_priority(p, priority)
    spec_data: dict[str, Any] = {
        "name": f"serve-{name}"[:128],
        "entrypoint": ENTRYPOINT,
        "project": "services",
        "tags": ["service"],
        "priority": priority,
        "max_restarts": SERVICE_RESTARTS,
        "resources": {
            "nodes": 1,
            "procs_per_node": replicas,
            "gpus_per_node": replicas * gpus_per_replica,
        },
        "env": {"OMP_NUM_THREADS": "1"},
    }
    try:
        spec = schedulable_spec(rt, orjson.dumps(spec_data).decode(), source="the service's job")
    except ResourceError as exc:
        raise ResourceError(
            f"service {name} ({replicas} replicas, {gpus_per_replica} GPU each) "
            f"{str(exc).removeprefix('job ')}"
        ) from None
    who = owner_of(p, owner)
    archive = empty_archive(rt)
    with rt.store.transaction():
        _check_name(rt, p, name, who)
        service = rt.store.services.create(
            name=name,
            owner=who,
            model=model,
            ref=ref,
            replicas=replicas,
            gpus_per_replica=gpus_per_replica,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            priority=priority,
            spec=spec,
            archive_sha256=archive,
        )
        audit.record(
            rt,
            p,
            "service.start",
            f"service:{name}",
            model=model,
            ref=ref,
            version=version.version,
            job=service.job_id,
        )
    rt.replicas.forget(name)
    rt.scheduler.wake()
    return view(rt, service)


def stop(rt: Runtime, p: Principal, name: str) -> dict[str, Any]:
    """Stop a service (its owner or an admin; anyone with auth off): its job is canceled as a
    job is (:meth:`JobRepo.cancel`: a queued one ends now; a running one's replicas get
    SIGTERM, then SIGKILL)."""
    service = rt.store.services.get(name)
    if p.authenticated and not p.is_admin and service.owner != p.name:
        raise Forbidden(f"service {name} belongs to {service.owner}; {p.name!r} may not stop it")
    canceled = False
    with rt.store.transaction():
        if service.job_id is not None:
            try:
                job: Job | None = rt.store.jobs.get(service.job_id)
            except NotFound:
                job = None
            if job is not None and job.state not in TERMINAL:
                rt.store.jobs.cancel(job.id)
                canceled = True
        service = rt.store.services.set_stopped(name)
        audit.record(rt, p, "service.stop", f"service:{name}", job=service.job_id)
    if canceled:
        rt.scheduler.wake()
    rt.replicas.forget(name)
    return view(rt, service)


async def predict(rt: Runtime, name: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    """Forward one prediction (``{"inputs": [...]}``) to a ready replica of ``name``, batched
    there with other clients' requests: its status, body and headers."""
    return await rt.replicas.predict(name, body)


def heartbeat(
    rt: Runtime,
    job: Job,
    *,
    rank: int,
    url: str,
    key: str,
    version: int | None,
    state: str,
    error: str | None,
    stats: dict[str, int],
    outputs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A replica of ``job`` (the job whose credential called) says where it listens (its
    node's address, or loopback on the server's node: :func:`reach_of`) and what it serves;
    the answer is what its service should serve now (``version`` null while its ref names
    none). ``outputs``: what the model of ``version`` answers, which the replica learned as it
    loaded it; recorded as the signature's outputs of that version when it has none (a
    checkpoint's), for the version the service serves only."""
    if outputs and version is not None and state == "ready":
        learn_outputs(rt, job, version, outputs)
    return rt.replicas.heartbeat(
        job,
        rank=rank,
        url=url,
        key=key,
        version=version,
        state=state,
        error=error,
        stats=stats,
        reach=reach_of(rt, job, rank),
    )


def reach_of(rt: Runtime, job: Job, rank: int) -> Reach:
    """Where replica ``rank`` of ``job`` may listen: the address of the node its rank was
    placed on, or loopback when that is the server's node."""
    executor = rt.scheduler.executor
    first = 0
    node = ""
    for placed in job.placement:  # node rank order, each node's ranks in turn
        if first <= rank < first + placed.procs:
            node = placed.node
            break
        first += placed.procs
    addresses = frozenset(executor.node_addresses(node)) if node else frozenset()
    return Reach(node or "unknown", executor.server_node(), addresses)


def learn_outputs(rt: Runtime, job: Job, version: int, outputs: list[dict[str, Any]]) -> None:
    """Record what a replica of ``job`` says version ``version`` of its model outputs, when
    its service serves that version and its signature has no outputs yet (nothing happens
    otherwise: the first report stays, and a replica changes no other version)."""
    try:
        service, found = _served_version(rt, job, version)
    except (NotFound, Forbidden):  # no service, or a version its ref does not name now
        return
    if found.signature.get("outputs"):
        return
    rt.store.models.learn_outputs(service.model, found.version, outputs)


def _served_version(rt: Runtime, job: Job, version: int) -> tuple[ServiceRecord, ModelVersion]:
    """``job``'s service and the version its ref names now, which must be ``version``: a
    replica downloads the version it is told to serve, never another (404 if the job runs
    no service, 403 for another version)."""
    service = rt.store.services.of_job(job.id)
    if service is None:
        raise NotFound(f"job {job.id} runs no service")
    target = rt.store.models.resolve(service.model, service.ref)
    if target.version != version:
        raise Forbidden(
            f"service {service.name} serves {service.model}@{target.version} now: a replica "
            f"downloads that version only, not {version}"
        )
    return service, target


def replica_file(rt: Runtime, job: Job, version: int, file: str) -> Iterator[bytes]:
    """The bytes of one file of a version of the service's model, in chunks (the replica
    checks its sha256)."""
    _, found = _served_version(rt, job, version)
    return rt.saved_models.read(found, file)


def replica_code(rt: Runtime, job: Job, version: int) -> Path:
    """Where the workdir archive of the job that made a version is: the code its loader lives
    in (404 once that job or its archive is gone)."""
    service, found = _served_version(rt, job, version)
    if found.job_id is None:
        raise NotFound(f"{found.model}@{found.version}'s job is deleted, with its code")
    source = rt.store.jobs.get(found.job_id)
    if not _owner_may_read(rt, service, source):  # the code is that job's owner's
        raise Forbidden(
            f"{found.model}@{found.version}'s loader is code of job {source.id}, which the "
            f"service's owner {service.owner} may not read"
        )
    archive = rt.blobs.path(source.archive_sha256)
    if not archive.is_file():
        raise NotFound(f"job {source.id}'s workdir archive is no longer on the server")
    return archive


def _owner_may_read(rt: Runtime, service: ServiceRecord, job: Job) -> bool:
    """Whether the owner of ``service`` may read ``job`` (anyone may with auth off)."""
    if not rt.settings.auth_enabled:
        return True
    try:
        user = rt.store.accounts.get_user(service.owner)
    except NotFound:
        return False
    if not user.active:
        return False
    return Principal(user.name, user.role).may_read(job, rt.settings.job_visibility)


def _check_name(rt: Runtime, p: Principal, name: str, who: str) -> None:
    """A service's name stays its owner's once it stopped: their clients call it by that name,
    and another member's service under it would answer them (403; an admin may)."""
    try:
        old = rt.store.services.get(name)
    except NotFound:
        return
    if old.owner != who and p.authenticated and not p.is_admin:
        raise Forbidden(
            f"service {name} belongs to {old.owner}: the name stays theirs (its clients call "
            "it by it); choose another --name"
        )
