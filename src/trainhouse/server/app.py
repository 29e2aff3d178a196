"""The app factory: ``create_app(settings)`` builds the API; its lifespan runs the background loops.

``create_app(settings, executor=...)`` runs the app on a given executor instead of the one
``settings.executor`` names (tests run the real API over a fake one).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from trainhouse import __version__
from trainhouse.core.errors import ServerBusy, TrainhouseError
from trainhouse.server import limits, origin, predict, registrations
from trainhouse.server.mlflow import create_app as create_mlflow_app
from trainhouse.server.mlflow import set_runtime as set_mlflow_runtime
from trainhouse.server.routes import (
    accounts,
    artifacts,
    datasets,
    envs,
    flows,
    jobs,
    lineage,
    logs,
    media,
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
from trainhouse.usecases.errors import Unstorable
from trainhouse.usecases.runtime import build_runtime
from trainhouse.usecases.settings import Settings

if TYPE_CHECKING:
    from trainhouse.executors.base import Executor

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


class API(FastAPI):
    """FastAPI, with the predictions of services answered ahead of it (its middleware, its
    router, its own checks per request): :mod:`trainhouse.server.predict`, through the same
    origin guard and body limit in a stack of their own. FastAPI's way to a route cost a
    prediction more CPU than all the rest of its way to a replica and back. A job's
    checkpoint registrations too (:mod:`trainhouse.server.registrations`): the way cost a
    third of the server's CPU per checkpoint."""

    predictions: ASGIApp | None = None
    #: the registrations of checkpoints, likewise (:mod:`trainhouse.server.registrations`)
    registrations: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.predictions is not None and predict.service_of(scope) is not None:
            scope["app"] = self  # as Starlette does: the runtime is the app's state
            await self.predictions(scope, receive, send)
            return
        if self.registrations is not None and registrations.job_of(scope) is not None:
            scope["app"] = self
            await self.registrations(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request through FastAPI's stack and router, as if no lean path took it (what
        a lean path hands back: a body its checks leave to the route)."""
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, *, executor: Executor | None = None) -> FastAPI:
    """The API over ``settings``; ``executor`` replaces the one ``settings.executor`` names."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = build_runtime(settings, executor)
        app.state.runtime = rt
        set_mlflow_runtime(mlflow_app, rt)
        try:
            rt.start()
            log.info("trainhouse %s serving %s (home %s)", __version__, settings.url, settings.home)
            yield
        finally:
            await rt.close()

    app = API(
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

    @app.exception_handler(Unstorable)
    async def _unstorable(_request: Request, exc: Unstorable) -> JSONResponse:
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
    app.include_router(artifacts.router, prefix="/api/v1")
    app.include_router(lineage.router, prefix="/api/v1")
    app.include_router(report.router, prefix="/api/v1")
    app.include_router(media.router, prefix="/api/v1")
    app.include_router(searches.router, prefix="/api/v1")
    app.include_router(models.router, prefix="/api/v1")
    app.include_router(datasets.router, prefix="/api/v1")
    app.include_router(flows.router, prefix="/api/v1")
    app.include_router(services.router, prefix="/api/v1")
    app.include_router(system.exposition)  # GET /metrics (Prometheus)
    app.include_router(ui.router)  # the dashboard: / and /static/...
    mlflow_app = create_mlflow_app()
    app.mount("/mlflow", mlflow_app)  # MLflow's tracking API (trainhouse.server.mlflow)
    # request bodies past a route's limit: 413
    limits.install(
        app,
        settings.max_upload_bytes,
        settings.mlflow_artifact_bytes,
        settings.dataset_upload_bytes,
    )
    origin.install(app, settings)  # outermost: unknown hosts 400, cross-origin writes 403
    # predictions ahead of all that, through the same guard and limit (server.predict)
    app.predictions = predict.predictions(settings)
    app.registrations = registrations.registrations(settings)
    return app
