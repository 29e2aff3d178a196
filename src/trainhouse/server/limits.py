"""Request body limits: a pure ASGI middleware that answers 413 before a body can hurt.

A body is refused when its ``Content-Length`` is over the route's limit (before the app sees
the request), and also when a body without one (chunked, streamed) grows past the limit while
it is being read: the bytes are counted in the ``receive`` the app is given; the read that goes
over raises :class:`BodyTooLarge` in the app (later reads answer ``http.disconnect``), and
whatever the app answers or raises then is replaced by the 413, as long as no response has
started. Once one has, the exception propagates and the server drops the connection.

The answer is the API's error shape::

    {"error": {"code": "too_large", "message": "request body is larger than 1 MiB ..."}}
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainhouse.core.errors import BodyTooLarge

MiB = 1024 * 1024
#: metric reports (``POST /api/v1/jobs/{id}/report``): up to 200,000 points per batch
REPORT_LIMIT = 64 * MiB
#: one image (4 MiB of PNG) or histogram (1,000,000 float32 values), base64 in JSON
#: (``POST /api/v1/jobs/{id}/media``)
MEDIA_LIMIT = 8 * MiB
#: a prediction forwarded to a service's replica (``POST /api/v1/services/{name}/predict``)
PREDICT_LIMIT = 8 * MiB
#: everything not listed per route: forms, JSON bodies, cancel, priority, ...
DEFAULT_LIMIT = 1 * MiB


def describe(limit: int) -> str:
    """``1 MiB``, ``101 MiB``, ``1.5 MiB``; below 1 MiB in bytes."""
    if limit >= MiB:
        return f"{limit / MiB:.1f}".removesuffix(".0") + " MiB"
    return f"{limit} bytes"


class BodyLimit:
    """Refuse request bodies larger than the route's limit with a 413 JSON error.

    ``per_route`` holds ``(method, path regex, limit in bytes)``; the first whose method is the
    request's (or ``*``) and whose regex matches the whole path wins; ``default`` applies to
    every other request.
    """

    def __init__(
        self, app: ASGIApp, default: int, per_route: Iterable[tuple[str, str, int]] = ()
    ) -> None:
        self.app = app
        self.default = default
        self.routes = [
            (method.upper(), re.compile(path), limit) for method, path, limit in per_route
        ]

    def limit_for(self, method: str, path: str) -> int:
        for route_method, pattern, limit in self.routes:
            if route_method in (method, "*") and pattern.fullmatch(path):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        limit = self.limit_for(method, path)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(send, limit, method, path, f"Content-Length is {declared}")
            return

        received = 0
        exceeded = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:  # the request is over: a listener for disconnects learns it
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise BodyTooLarge(limit)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's answer to a body it could not read: the 413 replaces it
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            # BodyTooLarge itself, in an ExceptionGroup, or whatever the app made of it
            if started or not exceeded:
                raise
        if exceeded and not started:
            detail = f"stopped after reading {received} bytes"
            await self._refuse(send, limit, method, path, detail)

    @staticmethod
    async def _refuse(send: Send, limit: int, method: str, path: str, detail: str) -> None:
        body = orjson.dumps(
            {
                "error": {
                    "code": "too_large",
                    "message": f"request body is larger than {describe(limit)}, the limit for "
                    f"{method} {path} ({detail})",
                }
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),  # the rest of the body is never read
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses it first; the body is counted anyway
    return None


def route_limits(
    max_upload_bytes: int, artifact_bytes: int = MiB, dataset_bytes: int = MiB
) -> list[tuple[str, str, int]]:
    """The per-route limits of the trainhouse API (MLflow's log-batch and the rest of its
    JSON routes keep the default, 1 MiB, MLflow's own limit of a batch)."""
    upload = max_upload_bytes + MiB  # the archive plus the spec and the form's framing
    return [
        ("POST", r"/api/v1/jobs/?", upload),
        ("POST", r"/api/v1/jobs/dry-run/?", upload),
        # every step's archive together (a flow's steps usually share one workdir, sent once)
        ("POST", r"/api/v1/flows/?", upload),
        ("POST", r"/api/v1/jobs/[^/]+/report/?", REPORT_LIMIT),
        ("POST", r"/api/v1/jobs/[^/]+/media/?", MEDIA_LIMIT),
        ("POST", r"/api/v1/services/[^/]+/predict/?", PREDICT_LIMIT),
        ("POST", r"/api/v1/datasets/[^/]+/upload/?", dataset_bytes + MiB),
        ("PUT", r"/mlflow(/jobs/[^/]+)?/api/2\.0/mlflow-artifacts/artifacts/.*", artifact_bytes),
    ]


def _is_body_limit(cls: object) -> bool:
    return isinstance(cls, type) and issubclass(cls, BodyLimit)


def install(
    app: FastAPI, max_upload_bytes: int, artifact_bytes: int = MiB, dataset_bytes: int = MiB
) -> None:
    """Add the body limits to ``app`` (once: installing again replaces the earlier limits)."""
    app.user_middleware[:] = [m for m in app.user_middleware if not _is_body_limit(m.cls)]
    app.add_middleware(
        BodyLimit,
        default=DEFAULT_LIMIT,
        per_route=route_limits(max_upload_bytes, artifact_bytes, dataset_bytes),
    )
