"""``POST /api/v1/services/{name}/predict`` on a lean path: a stack of its own that answers a
prediction ahead of FastAPI, its middleware and router (:class:`trainhouse.server.app.API`).

Why: users and load balancers call the server's URL, never a replica's, so every prediction
pays the server's way to its replica. Routed by FastAPI, that way cost about 1.4 ms of CPU per
prediction on the 2-core VM (bench/serve.py): the router matches the path against the API's
routes in turn, two plain-``def`` dependencies (the caller, ``signed_in``) each hop to a worker
thread and back, FastAPI's own layers wrap every request (its telemetry switch, read from the
environment each time, an error and a body-limit layer), and a Request and a Response are
built around bytes that are only passed on; a replica answers one in about 0.3 ms, and through
the server a service answered 0.21 of what its replica answered straight. Here the request is
matched by a prefix, a suffix and the name's pattern, the caller is known without a thread when
its token was verified in the last seconds, and the body goes to the replica as it came,
unparsed (the replica parses and checks it).

A prediction passes the checks of the routed request, in the same order (:func:`predictions`):

1. the ``Host`` header and the cross-origin rule (:class:`~trainhouse.server.origin.OriginGuard`,
   built for the same settings as the app's: 400, 403);
2. the body's size (:class:`~trainhouse.server.limits.BodyLimit`, the same per-route limits:
   413 past ``PREDICT_LIMIT``, declared or streamed; the limit's ``receive`` raises into
   :class:`LeanPredict`, whose answer the limit's 413 replaces);
3. the service's name: a name the route's pattern refuses is not taken here, and the app
   answers 422 as it always did (as it answers any other method, path or a trailing slash);
4. who is asking: the token of the ``Authorization: Bearer`` header or of the dashboard's
   cookie (with the CSRF header on a write) read by the same function as every route's
   (:func:`trainhouse.server.auth.request_token`), the principal it names
   (:func:`trainhouse.usecases.callers.principal_of`, in a worker thread when it needs a
   query: 401, 429 past the failure limit, each refusal audited), and the route's rule that
   a job's credential may not predict (:func:`trainhouse.server.auth.signed_in`: 403);
5. the forwarding itself (:meth:`trainhouse.usecases.replicahub.ReplicaHub.predict`): a ready
   replica round robin with its key, the service's own pool of keep-alive connections
   (:mod:`trainhouse.usecases.replicaclient`), no redirect followed, an answer capped; a
   request whose replica died before a byte of its answer sent once more to the next ready
   one; 503 without a ready replica, 502 for one that fails while answering, 404 for a
   service that never was.

The answer is the replica's status and body with ``Content-Type: application/json`` (what the
replica's app answers; its own header is not passed on: a replica runs its model owner's code,
and another type would let it serve a page on the server's origin). Errors are the API's
shape, ``{"error": {"code", "message"}}``; anything unexpected is logged and answers 500 as
the app's handler does.
"""

from __future__ import annotations

import logging
import math
import re

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainhouse.core.errors import ServerBusy, TrainhouseError
from trainhouse.server import limits, origin
from trainhouse.server.auth import bearer, client_address, request_token, signed_in
from trainhouse.server.routes.services import NAME
from trainhouse.usecases import callers, services
from trainhouse.usecases.access import OPEN, Principal
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "/api/v1/services/"
SUFFIX = "/predict"
_NAME = re.compile(NAME)
_JSON = (b"content-type", b"application/json")


def service_of(scope: Scope) -> str | None:
    """The service a request predicts with, when it is ``POST`` to this path with a name the
    route's pattern takes; None for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if not (path.startswith(PREFIX) and path.endswith(SUFFIX)):
        return None
    name = path[len(PREFIX) : -len(SUFFIX)]
    return name if _NAME.fullmatch(name) else None


class LeanPredict:
    """The ASGI app of predictions (a request :func:`service_of` names a service for)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = service_of(scope)
        assert name is not None, "only predictions are sent here"
        request = Request(scope)
        rt: Runtime = scope["app"].state.runtime
        try:
            await caller(request, rt)
            body = await read_body(receive)
            if body is None:  # the client left: nobody to answer
                return
            status, content, headers = await services.predict(rt, name, body)
        except TrainhouseError as exc:  # BodyTooLarge too: the body limit's 413 replaces it
            await _error(send, exc)
            return
        except Exception:
            log.exception("internal error")
            await _answer(send, 500, INTERNAL)
            return
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await _answer(send, status, content, extra)


async def caller(request: Request, rt: Runtime) -> Principal:
    """Who predicts: what ``trainhouse.server.auth.signed_in`` (over ``caller``) answers for
    the request, with no hop to a worker thread for a user's token verified lately."""
    client = client_address(request)
    if not rt.auth.enabled:
        return signed_in(OPEN.at(client))
    token = request_token(request, await bearer(request))
    found = callers.known_principal(rt, token, client)
    if found is None:  # a query (a job's credential, a token not seen lately): off the loop
        found = await run_in_threadpool(callers.principal_of, rt, token, client)
    return signed_in(found)


async def read_body(receive: Receive) -> bytes | None:
    """The request's body as it came (one message for most); None if the client left."""
    message = await receive()
    if message["type"] != "http.request":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _error_body(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


INTERNAL = _error_body("internal", "internal server error; see the server log")


async def _error(send: Send, exc: TrainhouseError) -> None:
    extra = []
    if isinstance(exc, ServerBusy):
        extra.append((b"retry-after", str(max(1, math.ceil(exc.retry_after))).encode()))
    await _answer(send, exc.status, _error_body(exc.code, str(exc)), extra)


async def _answer(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode()), *(extra or ())]
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def predictions(settings: Settings) -> ASGIApp:
    """The predictions' own stack: the origin guard, the body limit (each as the app's
    middleware has it for ``settings``), then :class:`LeanPredict`."""
    return lean_stack(LeanPredict(), settings)


def lean_stack(inner: ASGIApp, settings: Settings) -> ASGIApp:
    """``inner`` behind the origin guard and the body limit, each as the app's middleware has
    it for ``settings``: the checks every lean path keeps (predictions, registrations)."""
    limited = limits.BodyLimit(
        inner,
        default=limits.DEFAULT_LIMIT,
        per_route=limits.route_limits(
            settings.max_upload_bytes, settings.mlflow_artifact_bytes, settings.dataset_upload_bytes
        ),
    )
    return origin.OriginGuard(limited, hosts=origin.Hosts.of(settings))
