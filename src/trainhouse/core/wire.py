"""HTTP to a trainhouse server, shared by the client and the SDK: one request, its error body
as a :class:`~trainhouse.core.errors.ClientError` (or
:class:`~trainhouse.core.errors.ServerUnreachable`), and JSON bodies encoded fast. httpx and orjson
only.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson

from trainhouse.core.errors import ClientError, ServerUnreachable

__all__ = [
    "CLIENT_HEADERS",
    "CSRF_HEADER",
    "FILE_WORK_READ",
    "JSON_HEADERS",
    "encode_json",
    "error_from",
    "file_work_wait",
    "send",
]

#: seconds a caller waits for the answer to a request the server answers once it has hashed or
#: copied a job's files (a model registration): that work is bounded by the server's caps
#: (``--model-max-bytes``) and waits its turn in a bounded pool, so it may take minutes
FILE_WORK_READ = 3600.0


def file_work_wait(http: httpx.Client) -> dict[str, Any]:
    """The request extensions that wait :data:`FILE_WORK_READ` seconds for the answer (the
    client's other timeouts kept): for a request the server answers once it has hashed or
    copied a job's files. As extensions, not ``timeout=``, which Starlette's test client
    refuses with a warning."""
    current = http.timeout
    wait = httpx.Timeout(
        connect=current.connect, read=FILE_WORK_READ, write=current.write, pool=current.pool
    )
    return {"timeout": wait.as_dict()}


#: a header no page of another origin can send without the server's leave (a CORS preflight,
#: which the server never grants): a write must carry it or come from the server's own pages
CSRF_HEADER = "X-Trainhouse-Request"
#: what every request of the client and the SDK carries
CLIENT_HEADERS = {CSRF_HEADER: "1"}


def send(http: httpx.Client, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to a trainhouse server; its error body (or silence) as a ClientError."""
    try:
        resp = http.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise ServerUnreachable(url, str(exc) or type(exc).__name__) from None
    if resp.status_code >= 400:
        raise error_from(resp, url)
    return resp


def error_from(resp: httpx.Response, url: str) -> ClientError:
    """The ClientError an error answer (read already) stands for."""
    try:
        err = resp.json()["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        code = "http_error"
        message = (
            f"{url} answered HTTP {resp.status_code} {resp.reason_phrase} without "
            "a trainhouse error; is it a trainhouse server (TRAINHOUSE_URL)?"
        )
    return ClientError(message, status=resp.status_code, code=code)


JSON_HEADERS = {"Content-Type": "application/json"}


def encode_json(payload: Any) -> bytes:
    """``payload`` as JSON, by orjson (a 50,000-point batch in milliseconds); NaN and infinity
    become null. An integer past 64 bits (a step the server refuses) goes through json."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload).encode()
