"""An MLflow-compatible tracking API under ``/mlflow``: the part of MLflow's REST API that the
mlflow client's fluent API, ``MlflowClient``, transformers' ``MLflowCallback`` and Lightning's
``MLFlowLogger`` use, mapped onto jobs (the routes: :mod:`.tracking`, :mod:`.artifacts`; the
caller: :mod:`.access`; the wire format: :mod:`.protocol`; the work, and who may do what:
:mod:`trainhouse.usecases.tracking`).

It is an app of its own, mounted at ``/mlflow`` and at ``/mlflow/jobs/<id>`` (a job's scope),
so that every error it answers is in MLflow's shape (``{"error_code", "message"}``): an unknown
route is a 404 ``ENDPOINT_NOT_FOUND``, never a 5xx (the client retries those for minutes).
A browser that follows the client's "View run at ..." link (``/mlflow/jobs/<id>/#/...``) is
sent to the job's page.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainhouse.core.errors import MlflowError, ServerBusy, TrainhouseError
from trainhouse.server.mlflow import artifacts, tracking
from trainhouse.server.mlflow.protocol import from_trainhouse, missing
from trainhouse.usecases.errors import Unstorable
from trainhouse.usecases.runtime import Runtime

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def _answer(exc: MlflowError) -> JSONResponse:
    answer = JSONResponse({"error_code": exc.code, "message": exc.message}, status_code=exc.status)
    if exc.status in (429, 503):
        answer.headers["Retry-After"] = "1"
    return answer


def create_app() -> FastAPI:
    """The MLflow API; its lifespan is the main app's (``set_runtime`` hands it the
    services)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.exception_handler(MlflowError)
    async def _mlflow_error(_request: Request, exc: MlflowError) -> JSONResponse:
        return _answer(exc)

    @app.exception_handler(TrainhouseError)
    async def _domain_error(_request: Request, exc: TrainhouseError) -> JSONResponse:
        answer = _answer(from_trainhouse(exc))
        if isinstance(exc, ServerBusy):
            answer.headers["Retry-After"] = str(max(1, round(exc.retry_after)))
        return answer

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _answer(MlflowError(400, "INVALID_PARAMETER_VALUE", str(exc.errors())[:500]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return _answer(
                MlflowError(
                    404,
                    "ENDPOINT_NOT_FOUND",
                    f"{request.method} {request.url.path[:200]}: this server serves a part of "
                    "MLflow's API (see the README, 'Bring your own script'), not this route",
                )
            )
        return _answer(MlflowError(exc.status_code, "BAD_REQUEST", str(exc.detail)))

    @app.exception_handler(Unstorable)
    async def _unstorable(_request: Request, exc: Exception) -> JSONResponse:
        log.error("the database refused a value from an MLflow request: %s", exc)
        return _answer(
            MlflowError(400, "INVALID_PARAMETER_VALUE", "a value in the request cannot be stored")
        )

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error in the MLflow API")
        return _answer(MlflowError(500, "INTERNAL_ERROR", "internal server error; see its log"))

    @app.get("/", include_in_schema=False)
    @app.get("/jobs/{job_id}", include_in_schema=False)
    @app.get("/jobs/{job_id}/", include_in_schema=False)
    async def _ui(request: Request) -> RedirectResponse:
        """MLflow's "View run at <tracking URI>/#/experiments/E/runs/R" link: a job's scope
        lands on the job's page; the server's own scope on the dashboard, whose route for
        ``#/experiments/E/runs/R`` (the fragment a browser keeps across the redirect) is the
        job's page too."""
        top = request.scope.get("root_path", "").removesuffix("/mlflow")
        raw = request.path_params.get("job_id")
        if raw is None:
            return RedirectResponse(f"{top}/", status_code=303)
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            raise missing(f"job {raw[:40]!r} does not exist")
        return RedirectResponse(f"{top}/#/jobs/{int(raw)}", status_code=303)

    for prefix in ("", "/jobs/{job_id}"):
        app.include_router(tracking.router, prefix=prefix)
        app.include_router(artifacts.router, prefix=prefix)
    return app


def set_runtime(app: FastAPI, rt: Runtime) -> None:
    app.state.runtime = rt
