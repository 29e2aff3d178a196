"""The server's side of services: where each service's replicas are, what they should serve,
and the predictions it forwards to them.

A service is a long-running job whose ranks are replicas (``trainhouse.serving.follow``). Each
replica calls in about once a second with its job's credential (``POST
/api/v1/jobs/{id}/replicas``): where it listens, the key it wants on every prediction, the
version it serves and its state. :meth:`ReplicaHub.heartbeat` keeps that in memory and answers
what the service should serve now (its ``ref`` resolved: moving an alias moves every replica
to the new version, which it loads beside the old one and swaps in between two batches). After a
restart of the server the replicas' next calls fill the table again: nothing of it is stored.

``POST /api/v1/services/{name}/predict`` (answered ahead of FastAPI, by
:mod:`trainhouse.server.predict`) goes to a ready replica, round robin, through the service's
own pool of keep-alive connections (:mod:`.replicaclient`). A replica that cannot be reached is
skipped for the next (the request never got to it). One whose connection ends before a byte of
its answer (it died with the request: SIGKILLed, out of memory) is not sent another prediction
until its next call says it is ready, and the request goes once more, to the next ready replica:
a prediction changes nothing, so running it twice is harmless, and once only, so a request that
kills whatever runs it takes two replicas at most, never the whole service. A replica that
fails once its answer has begun, or with a hostile or late answer, gives 502 (nothing is sent
again: its answer may have been the cause).
Each forwarded prediction is counted in the server's Prometheus registry per service (requests
by outcome, latency, the size of the batch it ran in) and in a window of the last minute that
the Services page reads.

What a job reports is hostile: a replica's address must be the address of the node its rank runs
on (as the executor knows it: Ray's address of the node), or a loopback address when that node is
the server's own, with a port above 1023; the server sends it nothing but ``POST /predict``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram

from trainhouse.core.errors import (
    BadReplica,
    NotFound,
    ReplicaFailed,
    ServiceUnavailable,
    TrainhouseError,
)
from trainhouse.core.lifecycle import TERMINAL, JobState
from trainhouse.usecases.replicaclient import Dropped, Failed, ReplicaClient, Unreachable

if TYPE_CHECKING:
    from trainhouse.store import Job, ModelVersion, ServiceRecord, Store

__all__ = ["Reach", "Replica", "ReplicaHub", "check_replica_url"]

INTERVAL = 1.0  # seconds between a replica's calls
STALE_AFTER = 5.0  # a replica not heard from this long is not sent predictions
WINDOW = 60.0  # seconds of predictions the Services page summarises
RATE_WINDOW = 10.0  # requests/s over this many seconds
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: a replica's answer is read up to this many bytes (its loader is its owner's code: an answer
#: of any size would be read into the server's memory)
MAX_ANSWER = 64 << 20
#: connections one service's replicas get at most (each service has a pool of its own, so
#: one service's hung replicas leave the others' alone), and how long an answer may take
SERVICE_CONNECTIONS = 64
ANSWER_TIMEOUT = 60.0
CONNECT_TIMEOUT = 2.0


@dataclass(frozen=True)
class Reach:
    """Where one replica may listen: an address of the node it runs on (as its executor knows
    it), or loopback when that node is the server's own; from any other node a loopback
    address would be the server's, not the replica's."""

    node: str  # the node the replica's rank was placed on
    server_node: str
    addresses: frozenset[str] = frozenset()

    @property
    def local(self) -> bool:
        return self.node == self.server_node

    def check(self, host: str) -> None:
        """Nothing if a replica here may listen on ``host``; else why not (422)."""
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if host in self.addresses or (loopback and self.local):
            return
        known = ", ".join(sorted(self.addresses)) or "none known"
        if loopback:
            raise BadReplica(
                f"a replica on node {self.node} listens on {host!r}, a loopback address, but the "
                f"server runs on node {self.server_node}: it would reach itself, not the "
                f"replica; a replica off the server's node listens on its node's address "
                f"({known})"
            )
        allowed = "a loopback address or its node's" if self.local else "its node's address"
        raise BadReplica(
            f"a replica on node {self.node} listens on {allowed} ({known}), not {host!r}"
        )


def check_replica_url(url: str, reach: Reach) -> str:
    """``url`` if it is ``http://HOST:PORT`` with PORT above 1023 and HOST where ``reach``
    lets the replica listen; else a :class:`TrainhouseError` (422)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    if parts.scheme != "http" or port is None or port < 1024 or parts.path not in ("", "/"):
        raise BadReplica(
            f"a replica's url must be http://HOST:PORT with a port above 1023: {url!r}"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise BadReplica(f"a replica's url has nothing but a host and a port: {url!r}")
    reach.check(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class Replica:
    """One replica as its last call described it."""

    job_id: int
    attempt: int
    rank: int
    url: str
    key: str
    version: int | None  # the version it serves; None while the first one loads
    state: str  # loading | ready | failed
    error: str | None
    seen: float
    started: float
    stats: dict[str, int] = field(default_factory=dict)

    def fresh(self, now: float) -> bool:
        return now - self.seen <= STALE_AFTER

    def public(self, now: float) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "attempt": self.attempt,
            "url": self.url,
            "version": self.version,
            "state": self.state if self.fresh(now) else "lost",
            "error": self.error,
            "last_seen": self.seen,
            "started_at": self.started,
            **{k: self.stats.get(k, 0) for k in ("requests", "batches", "examples")},
        }


class _Window:
    """The last :data:`WINDOW` seconds of one service's forwarded predictions."""

    def __init__(self) -> None:
        self.items: deque[tuple[float, float, int, bool]] = deque()  # (at, seconds, batch, ok)
        self.total = 0
        self.errors = 0

    def add(self, at: float, seconds: float, batch: int, ok: bool) -> None:
        self.items.append((at, seconds, batch, ok))
        self.total += 1
        self.errors += not ok
        self._trim(at)

    def _trim(self, now: float) -> None:
        while self.items and now - self.items[0][0] > WINDOW:
            self.items.popleft()

    def summary(self, now: float) -> dict[str, Any]:
        self._trim(now)
        recent = [i for i in self.items if now - i[0] <= RATE_WINDOW]
        latencies = sorted(i[1] for i in self.items)
        batches = [i[2] for i in self.items if i[2] > 0]

        def pick(q: float) -> float | None:
            if not latencies:
                return None
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

        return {
            "requests_total": self.total,
            "errors_total": self.errors,
            "requests_per_s": len(recent) / RATE_WINDOW,
            "errors_per_s": sum(not i[3] for i in recent) / RATE_WINDOW,
            "latency_ms": {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99)},
            "mean_batch": sum(batches) / len(batches) if batches else None,
            "window_s": WINDOW,
        }


class _Series:
    """One service's labelled Prometheus series."""

    def __init__(self, hub: ReplicaHub, name: str) -> None:
        self.hub = hub
        self.name = name
        self.latency = hub.latency.labels(name)
        self.batch_size = hub.batch_size.labels(name)
        self._requests: dict[str, Any] = {}

    def requests(self, outcome: str) -> Any:
        counter = self._requests.get(outcome)
        if counter is None:
            counter = self._requests[outcome] = self.hub.requests.labels(self.name, outcome)
        return counter


class ReplicaHub:
    """Every service's replicas, their targets, and the predictions forwarded to them."""

    def __init__(self, store: Store, registry: CollectorRegistry) -> None:
        self.store = store
        self._replicas: dict[str, dict[int, Replica]] = {}  # service name -> rank -> replica
        self._windows: dict[str, _Window] = {}
        self._turn: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()
        self._http: dict[str, ReplicaClient] = {}  # a pool per service
        self._series: dict[str, _Series] = {}
        self.requests = Counter(
            "trainhouse_service_requests",
            "Predictions a service answered, by outcome (ok, bad_input, error, unavailable).",
            ["service", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "trainhouse_service_latency_seconds",
            "Seconds from a prediction's arrival at the server to its answer, per service.",
            ["service"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "trainhouse_service_batch_size",
            "Examples in the batch each prediction ran in, per service.",
            ["service"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )

    # -- what a service serves ---------------------------------------------------------------
    def target(self, service: ServiceRecord) -> ModelVersion:
        """The version ``service`` should serve now (its ref resolved)."""
        return self.store.models.resolve(service.model, service.ref)

    def heartbeat(
        self,
        job: Job,
        *,
        rank: int,
        url: str,
        key: str,
        version: int | None,
        state: str,
        error: str | None,
        stats: dict[str, int],
        reach: Reach,
    ) -> dict[str, Any]:
        """Record a replica's call; what its service should serve now. ``reach``: where that
        replica may listen."""
        service = self.store.services.of_job(job.id)
        if service is None:
            raise NotFound(f"job {job.id} runs no service")
        if not 0 <= rank < service.replicas:
            raise BadReplica(
                f"service {service.name} has replicas 0..{service.replicas - 1}; "
                f"there is no replica {rank}"
            )
        url = check_replica_url(url, reach)
        now = time.time()
        with self._lock:
            table = self._replicas.setdefault(service.name, {})
            for r, old in list(table.items()):  # an earlier attempt's or job's replicas
                if (old.job_id, old.attempt) != (job.id, job.attempts):
                    del table[r]
            known = table.get(rank)
            started = known.started if known is not None and known.url == url else now
            table[rank] = Replica(
                job.id, job.attempts, rank, url, key, version, state, error, now, started, stats
            )
        answer: dict[str, Any] = {
            "service": service.name,
            "model": service.model,
            "ref": service.ref,
            "max_batch": service.max_batch,
            "max_wait_ms": service.max_wait_ms,
            "interval": INTERVAL,
            "stopped": service.stopped,
        }
        try:
            found = self.target(service)
        except TrainhouseError as exc:  # the alias was removed, the version deleted: keep on
            return answer | {"version": None, "problem": str(exc)}
        return answer | {
            "version": found.version,
            "kind": found.kind,
            "files": found.files,
            "loader": found.record.get("loader"),
            "job_id": found.job_id,
        }

    def replicas(self, name: str) -> list[Replica]:
        with self._lock:
            return sorted(self._replicas.get(name, {}).values(), key=lambda r: r.rank)

    def forget(self, name: str) -> None:
        with self._lock:
            self._replicas.pop(name, None)

    def users_of(self, model: str, version: int) -> list[str]:
        """The services not stopped that serve ``version`` of ``model`` now, or name it by its
        number (a version they use is not deleted)."""
        running = {s.name: s for s in self.store.services.list() if not s.stopped}
        found = {s.name for s in running.values() if s.model == model and s.ref == str(version)}
        now = time.time()
        with self._lock:
            for name, table in self._replicas.items():
                serves = any(r.version == version and r.fresh(now) for r in table.values())
                if serves and name in running and running[name].model == model:
                    found.add(name)
        return sorted(found)

    def describe(self, service: ServiceRecord, job: Job | None) -> dict[str, Any]:
        """A service as ``serve show`` and the Services page show it."""
        now = time.time()
        # an ended job has no replica: the calls its replicas made before they stopped (one
        # may come after the stop forgot them) are not shown, nor counted ready
        mine = job.id if job is not None and job.state not in TERMINAL else None
        replicas = [r for r in self.replicas(service.name) if r.job_id == mine]
        ready = [r for r in replicas if r.state == "ready" and r.fresh(now)]
        versions = sorted({r.version for r in ready if r.version is not None})
        try:
            target: int | None = self.target(service).version
            problem = None
        except TrainhouseError as exc:
            target, problem = None, str(exc)
        with self._lock:
            window = self._windows.get(service.name)
            stats = (window or _Window()).summary(now)
        return {
            "name": service.name,
            "owner": service.owner,
            "model": service.model,
            "ref": service.ref,
            "target_version": target,
            "problem": problem,
            "versions": versions,
            "version": versions[0] if len(versions) == 1 else None,
            "state": self._state(service, job, len(ready)),
            "replicas": service.replicas,
            "ready_replicas": len(ready),
            "replica_list": [r.public(now) for r in replicas],
            "gpus_per_replica": service.gpus_per_replica,
            "max_batch": service.max_batch,
            "max_wait_ms": service.max_wait_ms,
            "priority": service.priority,
            "job_id": service.job_id,
            "job_state": None if job is None else str(job.state),
            "created_at": service.created_at,
            "updated_at": service.updated_at,
            "stats": stats,
        }

    @staticmethod
    def _state(service: ServiceRecord, job: Job | None, ready: int) -> str:
        if job is None:
            return "stopped" if service.stopped else "lost"
        if job.state in TERMINAL:
            return "stopped" if service.stopped or job.state == JobState.CANCELED else "failed"
        if service.stopped:
            return "stopping"
        if job.state == JobState.QUEUED:
            return "queued"
        if ready == 0:
            return "starting"
        return "ready" if ready >= service.replicas else "degraded"

    # -- predictions -------------------------------------------------------------------------
    async def predict(self, name: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Forward one prediction to a ready replica of ``name``: status, body, headers."""
        arrived = time.perf_counter()
        now = time.time()
        with self._lock:  # once: a prediction's way costs the server a few microseconds each
            table = self._replicas.get(name, {})
            candidates = [r for r in table.values() if r.state == "ready" and r.fresh(now)]
            turn = next(self._turn.setdefault(name, itertools.count())) if candidates else 0
        if not candidates:  # why not, from the database: off the event loop
            await asyncio.to_thread(self._unavailable, name)  # raises
        order = candidates[turn % len(candidates) :] + candidates[: turn % len(candidates)]
        http = self._client(name)
        dropped: str | None = None  # how the replica a request was sent again after failed
        for replica in order:
            try:
                answer = await http.post(replica.url, replica.key, body)
            except Unreachable:  # it never got the request: the next one may
                replica.state = "unreachable"
                continue
            except Dropped as exc:  # it died with the request: the next one gets it, once
                replica.state = "unreachable"  # until its next call says it is ready
                failed = f"replica {replica.rank} of service {name} failed while answering: {exc}"
                if dropped is None:
                    dropped = failed
                    continue
                self._count(name, "error", arrived, 0)
                raise ReplicaFailed(f"{dropped}; sent again, {failed}") from None
            except Failed as exc:
                self._count(name, "error", arrived, 0)
                raise ReplicaFailed(
                    f"replica {replica.rank} of service {name} failed while answering: {exc}"
                ) from None
            code = answer.status
            outcome = "ok" if code == 200 else "bad_input" if code < 500 else "error"
            self._count(name, outcome, arrived, answer.batch)
            return code, answer.body, {"x-trainhouse-replica": str(replica.rank)}
        if dropped is not None:  # no other replica to send it to
            self._count(name, "error", arrived, 0)
            raise ReplicaFailed(dropped)
        await asyncio.to_thread(self._unavailable, name)
        raise AssertionError("unreachable")  # pragma: no cover

    def _unavailable(self, name: str) -> None:
        service = self.store.services.get(name)  # NotFound for a service that never was
        self.requests.labels(name, "unavailable").inc()
        if service.stopped:
            raise ServiceUnavailable(f"service {name} is stopped")
        job = self.store.jobs.get(service.job_id) if service.job_id is not None else None
        where = f"its job {job.id} is {job.state}" if job is not None else "it has no job"
        raise ServiceUnavailable(f"service {name} has no ready replica ({where}); try again soon")

    def _count(self, name: str, outcome: str, arrived: float, batch: int) -> None:
        seconds = time.perf_counter() - arrived
        series = self._series.get(name)
        if series is None:  # labelled once per service: labels() costs each prediction ~3 us
            series = self._series[name] = _Series(self, name)
        series.requests(outcome).inc()
        series.latency.observe(seconds)
        if batch:
            series.batch_size.observe(batch)
        with self._lock:
            window = self._windows.setdefault(name, _Window())
            window.add(time.time(), seconds, batch, outcome != "error")

    def _client(self, name: str) -> ReplicaClient:
        """The pooled client of service ``name``'s forwarded predictions
        (:mod:`.replicaclient`): a pool of its own, bounded, so that no service takes
        another's connections."""
        http = self._http.get(name)
        if http is None:
            http = self._http[name] = ReplicaClient(
                connections=SERVICE_CONNECTIONS,
                connect_timeout=CONNECT_TIMEOUT,
                answer_timeout=ANSWER_TIMEOUT,
                max_answer=MAX_ANSWER,
            )
        return http

    async def aclose(self) -> None:
        pools, self._http = list(self._http.values()), {}
        for http in pools:
            await http.close()
