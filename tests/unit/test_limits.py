"""Request body limits (trainhouse.server.limits): on a tiny Starlette app, driven at the ASGI
level, and on the real app from create_app."""

from __future__ import annotations

import asyncio
import io
import os
import re
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.api import fake_executor, in_process
from trainhouse.errors import BodyTooLarge
from trainhouse.server import Settings, create_app
from trainhouse.server.limits import BodyLimit, MiB, describe, install

LIMIT = 1000


async def _echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse({"received": len(body)})


async def _swallow(request: Request) -> Response:
    """Like FastAPI's form parsing: any error while reading the body becomes a 400."""
    try:
        await request.body()
    except Exception:
        return PlainTextResponse("There was an error parsing the body", status_code=400)
    return PlainTextResponse("ok")


def tiny_app() -> BodyLimit:
    app = Starlette(
        routes=[
            Route("/echo", _echo, methods=["GET", "POST", "PUT"]),
            Route("/big/{name}", _echo, methods=["POST"]),
            Route("/swallow", _swallow, methods=["POST"]),
        ]
    )
    return BodyLimit(app, default=LIMIT, per_route=[("POST", r"/big/[^/]+", 10 * LIMIT)])


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(tiny_app()) as c:
        yield c


def too_large(resp: httpx.Response, limit_text: str) -> str:
    assert resp.status_code == 413, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == "too_large"
    message: str = body["error"]["message"]
    assert message.startswith(f"request body is larger than {limit_text}"), message
    return message


# -- the middleware on its own ------------------------------------------------------------------
def test_content_length_over_the_limit_is_413(client: TestClient) -> None:
    message = too_large(client.post("/echo", content=b"x" * (LIMIT + 1)), "1000 bytes")
    assert "the limit for POST /echo (Content-Length is 1001)" in message


def test_body_at_the_limit_and_small_requests_pass(client: TestClient) -> None:
    assert client.post("/echo", content=b"x" * LIMIT).json() == {"received": LIMIT}
    assert client.put("/echo", content=b"abc").json() == {"received": 3}
    assert client.get("/echo").json() == {"received": 0}
    assert client.post("/swallow", content=b"fine").text == "ok"


def test_per_route_limits(client: TestClient) -> None:
    assert client.post("/big/a", content=b"x" * 5 * LIMIT).json() == {"received": 5 * LIMIT}
    too_large(client.post("/big/a", content=b"x" * (10 * LIMIT + 1)), "10000 bytes")
    too_large(client.post("/echo", content=b"x" * 5 * LIMIT), "1000 bytes")  # the default
    # the regex must match the whole path: /big/a/b takes the default
    too_large(client.post("/big/a/b", content=b"x" * 5 * LIMIT), "1000 bytes")
    too_large(client.put("/big/a", content=b"x" * 5 * LIMIT), "1000 bytes")  # and the method


def test_chunked_body_over_the_limit_is_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b"x" * 400

    resp = client.post("/echo", content=chunks())
    message = too_large(resp, "1000 bytes")
    assert re.search(r"\(stopped after reading \d+ bytes\)$", message), message


def test_the_413_replaces_what_the_app_answers_to_an_unreadable_body(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"x" * 2 * LIMIT

    too_large(client.post("/swallow", content=chunks()), "1000 bytes")


def _drive(app: Any, path: str, chunks: list[bytes]) -> tuple[list[dict[str, Any]], int, Any]:
    """Call ``app`` with a streamed body (no Content-Length): (messages sent, chunks the app
    pulled, the exception it raised or None)."""
    sent: list[dict[str, Any]] = []
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": True}
        if pulled == len(chunks):
            pulled += 1
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)  # a client that keeps the connection open
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    async def run() -> Any:
        try:
            await app(scope, receive, send)
        except Exception as exc:
            return exc
        return None

    error = asyncio.run(run())
    return sent, pulled, error


def test_a_streamed_body_is_stopped_while_it_is_read() -> None:
    """100 chunks of 300 bytes against a 1000-byte limit: the fourth chunk ends the request;
    the other 96 are never pulled."""
    sent, pulled, error = _drive(tiny_app(), "/echo", [b"x" * 300] * 100)
    assert error is None
    assert pulled == 4
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b'"code":"too_large"' in sent[1]["body"]


async def _answer_then_read(scope: Any, receive: Any, send: Any) -> None:
    """An app that starts its response, then reads the whole body."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"started ", "more_body": True})
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.body", "body": b"never"})


def test_after_the_response_started_the_request_is_aborted() -> None:
    """No 413 can be sent any more: the error propagates, so the server drops the connection."""
    app = BodyLimit(_answer_then_read, default=LIMIT)
    sent, pulled, error = _drive(app, "/stream", [b"x" * 300] * 100)
    assert isinstance(error, BodyTooLarge) and error.limit == LIMIT
    assert pulled == 4
    assert [m.get("status") for m in sent] == [200, None]
    assert all(b"never" not in m.get("body", b"") for m in sent)


def test_streamed_body_through_httpx() -> None:
    async def run() -> tuple[httpx.Response, int, httpx.Response]:
        produced = 0

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal produced
            for _ in range(50):
                produced += 1
                yield b"y" * 250

        transport = httpx.ASGITransport(app=tiny_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            refused = await c.post("/echo", content=chunks())
            small = await c.post("/echo", content=b"z" * 10)
        return refused, produced, small

    refused, produced, small = asyncio.run(run())
    too_large(refused, "1000 bytes")
    assert produced < 50
    assert small.json() == {"received": 10}


def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    asyncio.run(BodyLimit(inner, default=1)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


@pytest.mark.parametrize(
    ("limit", "text"),
    [(MiB, "1 MiB"), (101 * MiB, "101 MiB"), (64 * MiB, "64 MiB"), (MiB * 3 // 2, "1.5 MiB")],
)
def test_describe(limit: int, text: str) -> None:
    assert describe(limit) == text
    assert describe(512) == "512 bytes"


# -- the trainhouse app --------------------------------------------------------------------------
UPLOAD = 2 * MiB  # max_upload_bytes: the submit routes accept 3 MiB, the others 1 MiB


@pytest.fixture
def app_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        home=tmp_path / "home", port=1, cpus=2, gpus="0", tick=0.1, max_upload_bytes=UPLOAD
    )
    app = create_app(settings, executor=fake_executor(settings))
    install(app, settings.max_upload_bytes)
    install(app, settings.max_upload_bytes)  # installing twice keeps one layer
    assert sum(m.cls is BodyLimit for m in app.user_middleware) == 1
    with in_process(app) as c:
        yield c


def _archive(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("train.py", b"print('hi')\n"), ("blob.bin", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _submit(c: TestClient, archive: bytes, path: str = "/api/v1/jobs") -> httpx.Response:
    return c.post(
        path,
        data={"spec": "entrypoint: python train.py"},
        files={"workdir": ("w.tar.gz", archive, "application/gzip")},
    )


def test_app_submit_over_the_limit_is_413(app_client: TestClient) -> None:
    message = too_large(_submit(app_client, os.urandom(4 * MiB)), "3 MiB")
    assert "POST /api/v1/jobs" in message
    assert app_client.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"] == []


def test_app_chunked_submit_over_the_limit_is_413(app_client: TestClient) -> None:
    """No Content-Length: the form parser reads until the limit, FastAPI turns the error into
    a 400, and the middleware answers 413 instead."""
    head = (
        b'--b\r\nContent-Disposition: form-data; name="spec"\r\n\r\nentrypoint: python t.py\r\n'
        b'--b\r\nContent-Disposition: form-data; name="workdir"; filename="w.tar.gz"\r\n'
        b"Content-Type: application/gzip\r\n\r\n"
    )

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(64):
            yield os.urandom(64 * 1024)
        yield b"\r\n--b--\r\n"

    for path in ("/api/v1/jobs", "/api/v1/jobs/dry-run"):
        resp = app_client.post(
            path, content=body(), headers={"content-type": "multipart/form-data; boundary=b"}
        )
        assert "stopped after reading" in too_large(resp, "3 MiB")
    assert app_client.get("/api/v1/jobs", params={"all": "true"}).json()["jobs"] == []


def test_app_normal_requests_are_unaffected(app_client: TestClient) -> None:
    assert app_client.get("/api/v1/health").json()["status"] == "ok"
    archive = _archive(os.urandom(3 * MiB // 2))  # over the 1 MiB default, under 3 MiB
    resp = _submit(app_client, archive)
    assert resp.status_code == 201, resp.text
    resp = _submit(app_client, archive, "/api/v1/jobs/dry-run")
    assert resp.status_code == 200, resp.text
    assert app_client.post("/api/v1/jobs/1/cancel").status_code == 200


def test_app_other_routes_take_1_mib_and_reports_64(app_client: TestClient) -> None:
    big = b"{" + b" " * (2 * MiB) + b"}"
    too_large(app_client.post("/api/v1/jobs/1/cancel", content=big), "1 MiB")
    too_large(app_client.put("/api/v1/quotas/someone", content=big), "1 MiB")
    # the report route takes 64 MiB: 2 MiB passes the middleware and reaches the route,
    # which refuses the missing credential (not a 413)
    resp = app_client.post("/api/v1/jobs/1/report", content=big)
    assert resp.status_code != 413 and 400 <= resp.status_code < 500, resp.text
    too_large(app_client.post("/api/v1/jobs/1/report", content=b" " * (64 * MiB + 1)), "64 MiB")
