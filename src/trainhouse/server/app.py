"""The app factory: ``create_app(settings)`` builds the API; its lifespan runs the services.

``create_app(settings, executor=...)`` runs the app on a given executor instead of the one
``settings.executor`` names (tests run the real API over a fake one).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainhouse._version import __version__
from trainhouse.errors import ServerBusy, TrainhouseError
from trainhouse.executors import registry
from trainhouse.executors.base import Executor
from trainhouse.executors.inventory import server_mask
from trainhouse.lifecycle import JobState
from trainhouse.monitoring.sampler import Sampler
from trainhouse.monitoring.telemetry import Telemetry
from trainhouse.scheduler.loop import SchedulerConfig, SchedulerLoop
from trainhouse.scheduler.policy import Quota
from trainhouse.server import limits, origin
from trainhouse.server.auth import Authenticator
from trainhouse.server.checkpoints import Checkpoints
from trainhouse.server.deps import Services
from trainhouse.server.housekeeping import Housekeeper
from trainhouse.server.mlflow import create_app as create_mlflow_app
from trainhouse.server.mlflow import set_services as set_mlflow_services
from trainhouse.server.models import ModelFiles
from trainhouse.server.routes import (
    accounts,
    envs,
    jobs,
    lineage,
    logs,
    models,
    queue,
    report,
    runs,
    searches,
    services,
    system,
    ui,
)
from trainhouse.server.schemas import NO_NUL
from trainhouse.server.serving import ServingHub
from trainhouse.server.settings import Settings
from trainhouse.server.tensorboard import TensorBoardImport
from trainhouse.store import BlobStore, Store
from trainhouse.store.groupcommit import ReportWriter
from trainhouse.tune.service import SearchService

log = logging.getLogger(__name__)


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = list(err.get("loc", ()))
        if where and where[0] in ("body", "query", "path"):
            where = where[1:]  # where it came from, not a field (a field may be named "path")
        loc = ".".join(str(p) for p in where)
        msg = err.get("msg", "invalid")
        if (
            err.get("type") == "string_pattern_mismatch"
            and err.get("ctx", {}).get("pattern") == NO_NUL
        ):
            msg = "must not contain a NUL character"
        parts.append(f"{loc or 'request'}: {msg}")
    return "; ".join(parts)


def build_services(settings: Settings, executor: Executor | None = None) -> Services:
    settings.home.mkdir(parents=True, exist_ok=True)
    if executor is None:
        executor = registry.build(settings)
    node = executor.server_node()
    store = Store(settings.database_url, migrate="auto")  # PostgreSQL: `db upgrade` first
    blobs = BlobStore(settings.home / "blobs")
    checkpoints = Checkpoints(store, settings.home, settings.checkpoint_url)
    loop = SchedulerLoop(
        store,
        blobs,
        executor,
        home=settings.home,
        server_url=settings.url,
        tick=settings.tick,
        cancel_grace=settings.cancel_grace,
        shutdown_grace=settings.shutdown_grace,
        checkpoint_location=checkpoints.location,
        on_attempt_end=checkpoints.register_unlisted,
        config=SchedulerConfig(
            half_life=settings.fairshare_half_life,
            max_infra_restarts=settings.max_infra_restarts,
            default_quota=Quota(settings.quota_gpus, settings.quota_cpus),
        ),
        env_defaults=settings.env_defaults,
    )

    def allocations() -> dict[int, list[int]]:  # running job -> its GPUs on this node
        running = store.jobs.list(states=[JobState.RUNNING])
        return {j.id: [g for p in j.placement if p.node == node for g in p.gpus] for j in running}

    monitor = Sampler(
        store.system,
        executor,
        node=node,
        interval=settings.monitor_interval,
        retention=settings.monitor_retention,
        allocations=allocations,
        gpu_mask=server_mask(),
    )
    telemetry = Telemetry()
    telemetry.watch(
        store, store.system, executor, stale_after=max(3 * settings.monitor_interval, 15.0)
    )
    loop.decision_observer = telemetry.decision_seconds.observe
    auth = Authenticator(
        store.accounts,
        enabled=settings.auth_enabled,
        limit=settings.auth_failures,
        window=settings.auth_window,
    )
    if auth.enabled and not store.accounts.has_admin():
        log.warning(
            "auth is on and there is no admin yet: run `trainhouse admin init` on this machine"
        )
    writers = settings.report_writers or (1 if store.dialect == "sqlite" else 4)
    reports = ReportWriter(store, writers=writers, queue_points=settings.report_queue_points)
    tensorboard = TensorBoardImport(
        store, reports, settings.home, interval=settings.tensorboard_interval
    )
    return Services(
        settings,
        store,
        blobs,
        loop,
        checkpoints,
        monitor,
        Housekeeper(store, settings.home, settings.log_retention),
        telemetry,
        auth,
        reports,
        SearchService(
            store,
            db_url=settings.database_url,
            home=settings.home,
            wake_scheduler=loop.wake,
            interval=max(settings.tick, 0.1),
        ),
        ModelFiles(store, checkpoints),
        ServingHub(store, telemetry.registry),
        tensorboard=tensorboard,
    )


def create_app(settings: Settings, *, executor: Executor | None = None) -> FastAPI:
    """The API over ``settings``; ``executor`` replaces the one ``settings.executor`` names."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = build_services(settings, executor)
        app.state.services = svc
        set_mlflow_services(mlflow_app, svc)
        started = []
        try:
            svc.reports.start()  # first and last: reports answered before the end are stored
            for service in svc.background:
                service.start()
                started.append(service)
            log.info("trainhouse %s serving %s (home %s)", __version__, settings.url, settings.home)
            yield
        finally:
            for service in reversed(started):
                service.stop()
            svc.reports.stop()  # stores what is queued
            await svc.serving.aclose()
            svc.store.close()

    app = FastAPI(
        title="trainhouse",
        version=__version__,
        description="A self-hosted training server.",
        lifespan=lifespan,
        docs_url=None,  # /docs is served offline, by routes.ui
        redoc_url=None,  # ReDoc's page loads its logo from a CDN: off
    )

    @app.exception_handler(TrainhouseError)
    async def _domain_error(_request: Request, exc: TrainhouseError) -> JSONResponse:
        answer = error(exc.status, exc.code, str(exc))
        if isinstance(exc, ServerBusy):
            answer.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return answer

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(DataError)
    async def _unstorable(_request: Request, exc: DataError) -> JSONResponse:
        # the database refused a value the request carried (too long, out of range, a NUL
        # character) that validation let through: the caller's, but the SQL stays in the log
        log.error("the database refused a value from a request: %s", exc)
        return error(
            422,
            "invalid_value",
            "a value in the request cannot be stored (too long, out of range, or holding a "
            "NUL character)",
        )

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error(500, "internal", "internal server error; see the server log")

    app.include_router(system.router, prefix="/api/v1")
    app.include_router(accounts.router, prefix="/api/v1")
    app.include_router(envs.router, prefix="/api/v1")
    app.include_router(queue.router, prefix="/api/v1")  # before jobs: /jobs/dry-run
    app.include_router(logs.router, prefix="/api/v1")  # before jobs: /logs/stream
    app.include_router(runs.router, prefix="/api/v1")  # before jobs: DELETE /jobs/{id}
    app.include_router(jobs.router, prefix="/api/v1")
    app.include_router(lineage.router, prefix="/api/v1")
    app.include_router(report.router, prefix="/api/v1")
    app.include_router(searches.router, prefix="/api/v1")
    app.include_router(models.router, prefix="/api/v1")
    app.include_router(services.router, prefix="/api/v1")
    app.include_router(system.exposition)  # GET /metrics (Prometheus)
    app.include_router(ui.router)  # the dashboard: / and /static/...
    mlflow_app = create_mlflow_app()
    app.mount("/mlflow", mlflow_app)  # MLflow's tracking API (trainhouse.server.mlflow)
    # request bodies past a route's limit: 413
    limits.install(app, settings.max_upload_bytes, settings.mlflow_artifact_bytes)
    origin.install(app, settings)  # outermost: unknown hosts 400, cross-origin writes 403
    return app
