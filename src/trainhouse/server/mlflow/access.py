"""Who calls the MLflow API: a request's token, address and scope (``/mlflow/jobs/<id>/...``:
that job's own API; ``/mlflow/...``: the server's) handed to
:func:`trainhouse.usecases.tracking.caller`, which checks them and says which job the request
may reach (:mod:`trainhouse.usecases.tracking.callers`)."""

from __future__ import annotations

from fastapi import Request

from trainhouse.server.auth import SAFE_METHODS, bearer_token, client_address
from trainhouse.server.mlflow.protocol import missing
from trainhouse.usecases import tracking
from trainhouse.usecases.runtime import Runtime


def caller(request: Request, rt: Runtime) -> tracking.Caller:
    """The caller of an MLflow request (in a worker thread: it may read the database)."""
    token = bearer_token(request.headers.get("authorization"))
    raw = request.path_params.get("job_id")
    scope = None
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            raise missing(f"job {raw[:40]!r} does not exist")
        scope = int(raw)
    return tracking.caller(
        rt,
        token,
        client_address(request),
        scope=scope,
        write=request.method not in SAFE_METHODS,
    )
