"""``POST /api/v1/jobs/{id}/checkpoints`` on a lean path: a stack of its own that answers a
checkpoint's registration ahead of FastAPI, its middleware and router, as
:mod:`trainhouse.server.predict` answers predictions (:class:`trainhouse.server.app.API`).

Why: every checkpoint a job saves is one registration, and the server's CPU for it is taken
from the cores its job's ranks run on. Routed by FastAPI, the route's way (the router matching
the path against the API's routes in turn, its dependencies, the body parsed by the standard
library's JSON parser and checked by pydantic, the report written back to bytes for its own
parser, the answer validated again) cost about a third of the server's CPU per registration
(bench/README.md, issue 34). Here the request is matched by a prefix, a suffix and the id's
digits, the body parsed once (orjson) and the work is the route's own use case
(:func:`trainhouse.usecases.reports.register`).

A registration passes the checks of the routed request, in the same order:

1. the ``Host`` header and the cross-origin rule (:class:`~trainhouse.server.origin.OriginGuard`,
   built for the same settings as the app's: 400, 403);
2. the body's size (:class:`~trainhouse.server.limits.BodyLimit`, the same limits: 413 past the
   default 1 MiB, declared or streamed; the limit's ``receive`` raises into
   :class:`LeanRegistration`, whose answer the limit's 413 replaces);
3. the job's id: an id the route's ``RowId`` would refuse, or spells otherwise than plain
   digits, is not taken here, nor any other method or path (a trailing slash): the app answers
   it as it always did;
4. the body: one the lean checks do not take as they are (not JSON for orjson, or not for the
   route's content types; refused by ``CheckpointIn``; an integer of 20 digits or more, which
   orjson reads as a float where the route's parser keeps an integer; a report
   :func:`~trainhouse.core.reports.parse_report` refuses) is handed, as it came, to the app:
   its answer (422, the report's refusal after the credential check) is the route's by
   construction. Malformed bodies are rare; only well formed ones need to be fast;
5. the job's credential, the points, the checkpoint in storage and its record: the use case,
   as the route calls it (401, 404, 422 for a checkpoint storage refuses, 503 when busy).

The answer is the route's: 201 with a ``CheckpointRegisteredOut``; errors are the API's shape,
``{"error": {"code", "message"}}`` (the app's handlers': a value the database refuses is 422
``invalid_value``; anything unexpected is logged and answers 500).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainhouse.core.errors import InvalidMetrics, TrainhouseError
from trainhouse.core.reports import INT64, Report, parse_report
from trainhouse.server.auth import bearer_token
from trainhouse.server.predict import (
    INTERNAL,
    _answer,
    _error,
    _error_body,
    lean_stack,
    read_body,
)
from trainhouse.server.schemas import CheckpointIn
from trainhouse.usecases import reports
from trainhouse.usecases.errors import Unstorable
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "/api/v1/jobs/"
SUFFIX = "/checkpoints"
_ID = re.compile(r"[0-9]{1,19}")
#: an integer orjson reads as a float (past 2**64), where the route's parser keeps it whole
_BIG_INT = re.compile(rb"[0-9]{20}")
_JSON_TYPES = (b"application/json",)
UNSTORABLE = _error_body(
    "invalid_value",
    "a value in the request cannot be stored (too long, out of range, or holding a NUL character)",
)


def job_of(scope: Scope) -> int | None:
    """The job a request registers a checkpoint for, when it is ``POST`` to this path with
    an id of plain digits the route's ``RowId`` takes; None for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if not (path.startswith(PREFIX) and path.endswith(SUFFIX)):
        return None
    digits = path[len(PREFIX) : -len(SUFFIX)]
    if not _ID.fullmatch(digits):
        return None
    job_id = int(digits)
    return job_id if job_id <= INT64 else None


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first header ``name`` (lower case) of the request, as Starlette's ``Headers.get``."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _bearer(scope: Scope) -> str | None:
    """The token of the ``Authorization`` header (decoded as Starlette decodes headers)."""
    raw = _header(scope, b"authorization")
    return bearer_token(None if raw is None else raw.decode("latin-1"))


def _client(scope: Scope) -> str:
    """``trainhouse.server.auth.client_address``."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _json_body(scope: Scope) -> bool:
    """Whether the route parses the body as JSON for its content type and the lean path takes
    it: no ``Content-Type`` or exactly ``application/json`` (what the SDK sends); the route's
    other JSON types (``application/x+json``, parameters) are left to it."""
    kind = _header(scope, b"content-type")
    return kind is None or kind.lower() in _JSON_TYPES


async def _checked(
    body: bytes,
) -> tuple[reports.Registration, Report | None] | None:
    """The registration and its report, parsed and checked as the route checks them; None
    for a body the lean path leaves to the route (see the module's docstring)."""
    if _BIG_INT.search(body):
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        checked = CheckpointIn.model_validate(data)
    except ValidationError:
        return None
    report = None
    if checked.report is not None:
        try:  # the report's own parser, as the route's (a big one in a worker thread)
            if len(body) <= reports.PARSE_INLINE:
                report = parse_report(checked.report)
            else:
                report = await in_thread(parse_report, checked.report)
        except InvalidMetrics:  # refused after the credential check: the route's answer
            return None
    fields = checked.model_dump(exclude={"report"})
    return reports.Registration(**fields), report


def answer_of(done: reports.Registered) -> bytes:
    """The route's answer, a ``CheckpointRegisteredOut`` (its fields in its order), written
    without building the model: the values are the record's, checked as they came in."""
    c, reported = done.checkpoint, done.report
    report = None
    if reported is not None:
        why = reported.stop_reason
        report = {"accepted": reported.accepted, "stop": why is not None, "stop_reason": why}
    return orjson.dumps(
        {
            "id": c.id,
            "job_id": c.job_id,
            "attempt": c.attempt,
            "step": c.step,
            "path": c.path,
            "size": c.size,
            "sha256": c.sha256,
            "metrics": c.metrics,
            "created_at": c.created_at,
            "deleted": c.deleted,
            "kind": c.kind,
            "corrupt": c.corrupt,
            "algorithm": c.algorithm,
            "report": report,
        }
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` again, then what ``receive`` gives (a disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class LeanRegistration:
    """The ASGI app of registrations (a request :func:`job_of` names a job for)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        job_id = job_of(scope)
        assert job_id is not None, "only registrations are sent here"
        app: Any = scope["app"]
        rt: Runtime = app.state.runtime
        try:
            body = await read_body(receive)
            if body is None:  # the client left: nobody to answer
                return
            checked = await _checked(body) if _json_body(scope) else None
        except TrainhouseError as exc:  # BodyTooLarge: the body limit's 413 replaces it
            await _error(send, exc)
            return
        if checked is None:  # the route answers it, as it always did (outside the try:
            # the app answers its own errors, and raises what it answered 500 for)
            await app.routed(scope, _replay(body, receive), send)
            return
        registration, report = checked
        try:
            done = await reports.register(
                rt, job_id, registration, report, _bearer(scope), _client(scope)
            )
        except TrainhouseError as exc:
            await _error(send, exc)
            return
        except Unstorable as exc:  # as the app's handler answers it
            log.error("the database refused a value from a request: %s", exc)
            await _answer(send, 422, UNSTORABLE)
            return
        except Exception:
            log.exception("internal error")
            await _answer(send, 500, INTERNAL)
            return
        await _answer(send, 201, answer_of(done))


def registrations(settings: Settings) -> ASGIApp:
    """The registrations' own stack: the origin guard, the body limit (each as the app's
    middleware has it for ``settings``), then :class:`LeanRegistration`."""
    return lean_stack(LeanRegistration(), settings)
