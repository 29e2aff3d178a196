"""``POST /api/v1/services/{name}/predict`` on its lean path (``trainhouse.server.predict``),
through the real app in process, to a raw loopback "replica" that answers whatever a test says:
the body goes as it came and the answer comes back as the replica gave it (its status, its
body; the content type the API's), and every check of the routed request still holds: the
token rules and roles with auth on, the origin guard, the body limit, the route's pattern; a
replica that dies or hangs mid-request answers 502 or 503 in the API's error shape, never 500.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    CROSS_SITE,
    app_client,
    cross_origin,
    error_of,
    page_request,
    services,
    wait_launched,
)
from tests.support.team import Team, make_team, refused
from trainhouse.core.modelfiles import REPLICA_KEY_HEADER
from trainhouse.core.records import Job
from trainhouse.core.tokens import hash_token, job_token
from trainhouse.core.wire import CSRF_HEADER
from trainhouse.server.auth import COOKIE
from trainhouse.server.limits import PREDICT_LIMIT
from trainhouse.server.routes.services import empty_archive
from trainhouse.spec import parse_spec
from trainhouse.usecases import replicahub
from trainhouse.usecases.replicahub import Reach
from trainhouse.usecases.runtime import Runtime

KEY = "a-replica-key-of-24-chars"
PREDICT = "/api/v1/services/rt/predict"
OK = b'{"outputs": [[1.0, 2.0]], "model": "tiny", "version": 1}'
Handler = Callable[["FakeReplica", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(body: bytes = OK, status: str = "200 OK", kind: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\nx-trainhouse-batch: 3\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class FakeReplica:
    """A loopback server in a thread of its own, running ``handler`` on each connection."""

    handler: Handler
    reply: bytes = answer()
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def read(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = (head, await reader.readexactly(length))
        self.requests.append(request)
        return request


async def answers(r: FakeReplica, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with ``r.reply``."""
    while True:
        await r.read(reader)
        w.write(r.reply)
        await w.drain()


@pytest.fixture
def replica() -> Iterator[Callable[[Handler], FakeReplica]]:
    """Start fake replicas (``replica(handler)``); each is stopped with the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers: list[asyncio.Server] = []
    writers: set[asyncio.StreamWriter] = set()

    def start(handler: Handler) -> FakeReplica:
        fake = FakeReplica(handler)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.add(writer)
            fake.connections += 1
            try:
                await fake.handler(fake, reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass  # the client left, or the test ended (a handler may sleep)
            finally:
                writer.close()

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(serve, "127.0.0.1", 0)

        server = asyncio.run_coroutine_threadsafe(listen(), loop).result(10)
        servers.append(server)
        fake.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return fake

    yield start

    async def stop() -> None:
        for server in servers:
            server.close()
        for writer in writers:
            writer.close()
        for server in servers:
            await server.wait_closed()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def make_service(rt: Runtime, owner: str = "alice", replicas: int = 1) -> Job:
    """Service ``rt`` of ``replicas`` (its job made with it); its job."""
    spec = parse_spec("name: serve-rt\nentrypoint: python -m trainhouse.serving.follow\n")
    made = rt.store.services.create(
        name="rt",
        owner=owner,
        model="tiny",
        ref="prod",
        replicas=replicas,
        gpus_per_replica=0,
        max_batch=8,
        max_wait_ms=1.0,
        priority="normal",
        spec=spec,
        archive_sha256=empty_archive(rt),
    )
    assert made.job_id is not None
    return rt.store.jobs.get(made.job_id)


def ready(rt: Runtime, job: Job, url: str, rank: int = 0) -> None:
    """What the service's replica ``rank`` says in its call: ready at ``url``, wanting
    ``KEY``."""
    rt.replicas.heartbeat(
        rt.store.jobs.get(job.id),
        rank=rank,
        url=url,
        key=KEY,
        version=1,
        state="ready",
        error=None,
        stats={},
        reach=Reach("here", "here"),
    )


def answering(rt: Runtime, job: Job, replica: Callable[[Handler], FakeReplica]) -> FakeReplica:
    """A fake replica answering every request with its ``reply``, ready for ``job``."""
    fake = replica(answers)
    ready(rt, job, fake.url)
    return fake


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Runtime, Job]]:
    """The app (auth off, jobs stay running) with service ``rt`` placed."""
    with app_client(tmp_path, exit_code=None) as client:
        rt = services(client)
        job = make_service(rt)
        wait_launched(client, job.id)
        yield client, rt, job


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def test_the_body_goes_as_it_came_and_the_answer_comes_back_as_given(
    api: tuple[TestClient, Runtime, Job], replica: Callable[[Handler], FakeReplica]
) -> None:
    client, rt, job = api
    fake = answering(rt, job, replica)
    raw = b'{"inputs":  [[1, 2]] ,\n "extra": "\xc3\xa9"}  '  # not reformatted, not parsed
    for _ in range(3):
        resp = client.post(PREDICT, content=raw)
        assert resp.status_code == 200, resp.text
        assert resp.content == OK
        assert resp.headers["content-type"] == "application/json"
        assert resp.headers["x-trainhouse-replica"] == "0"
    assert fake.connections == 1  # one kept-alive connection of the service's pool
    head, body = fake.requests[0]
    assert body == raw
    assert f"{REPLICA_KEY_HEADER}: {KEY}".encode() in head.split(b"\r\n")
    # the replica's status and body as they are; its content type is not passed on (a page
    # on the server's origin)
    fake.reply = answer(b'<script>alert("hi")</script>', "418 I'm a teapot", "text/html")
    odd = client.post(PREDICT, content=b"{}")
    assert odd.status_code == 418 and odd.content == b'<script>alert("hi")</script>'
    assert odd.headers["content-type"] == "application/json"
    shown = client.get("/api/v1/services/rt").json()["stats"]
    assert (shown["requests_total"], shown["errors_total"], shown["mean_batch"]) == (4, 0, 3)
    metrics = client.get("/metrics").text
    assert 'trainhouse_service_requests_total{outcome="ok",service="rt"} 3.0' in metrics
    assert 'trainhouse_service_requests_total{outcome="bad_input",service="rt"} 1.0' in metrics


def test_the_route_still_answers_what_the_lean_path_leaves_to_it(
    api: tuple[TestClient, Runtime, Job],
) -> None:
    client, _, _ = api
    bad = client.post("/api/v1/services/no!such/predict", json={"inputs": [1]})
    assert bad.status_code == 422 and error_of(bad)["code"] == "invalid_request"
    assert client.get(PREDICT).status_code == 405
    missing = client.post("/api/v1/services/nothing/predict", json={"inputs": [1]})
    assert missing.status_code == 404 and "nothing" in error_of(missing)["message"]
    waiting = client.post(PREDICT, json={"inputs": [1]})  # no replica has called in yet
    assert waiting.status_code == 503 and "no ready replica" in error_of(waiting)["message"]


def test_a_replica_that_dies_mid_request_answers_502_then_503(
    api: tuple[TestClient, Runtime, Job], replica: Callable[[Handler], FakeReplica]
) -> None:
    async def dies(r: FakeReplica, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(reader)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{")  # then the process dies
        await w.drain()
        w.transport.abort()

    client, rt, job = api
    fake = replica(dies)
    ready(rt, job, fake.url)
    died = client.post(PREDICT, json={"inputs": [1]})
    assert died.status_code == 502, died.text
    assert error_of(died)["code"] == "replica_failed"
    assert "closed the connection before its answer ended" in error_of(died)["message"]
    ready(rt, job, "http://127.0.0.1:1024")  # where nothing listens (the replica is gone)
    gone = client.post(PREDICT, json={"inputs": [1]})
    assert gone.status_code == 503, gone.text
    assert "no ready replica" in error_of(gone)["message"]
    shown = client.get("/api/v1/services/rt").json()
    assert shown["replica_list"][0]["state"] == "unreachable"
    assert shown["stats"]["errors_total"] == 1


@pytest.mark.parametrize("how", ["reset", "closed"])
def test_a_request_whose_replica_dies_before_answering_is_answered_by_the_other(
    tmp_path: Path, replica: Callable[[Handler], FakeReplica], how: str
) -> None:
    """A replica that dies with a request (its connection reset or closed before a byte of
    its answer) has the request sent once more to the other replica, and gets no other until
    its next call says it is ready; once an answer has begun, nothing is sent again: 502."""
    mode = {"answer": "none"}

    async def dies(r: FakeReplica, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(reader)
        if mode["answer"] == "begun":
            w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{")
            await w.drain()
        if how == "reset":
            w.transport.abort()  # unsent data dropped: an RST, as a killed process's socket
        else:
            w.close()

    with app_client(tmp_path, exit_code=None) as client:
        rt = services(client)
        job = make_service(rt, replicas=2)
        wait_launched(client, job.id)
        dying, alive = replica(dies), replica(answers)
        ready(rt, job, dying.url, rank=0)
        ready(rt, job, alive.url, rank=1)
        # round robin: one of two requests goes to replica 0 first
        got = [client.post(PREDICT, json={"inputs": [n]}) for n in range(2)]
        assert [(r.status_code, r.content) for r in got] == [(200, OK)] * 2, got[0].text
        assert [r.headers["x-trainhouse-replica"] for r in got] == ["1", "1"]
        assert len(dying.requests) == 1
        assert [body for _, body in alive.requests] == [b'{"inputs":[0]}', b'{"inputs":[1]}']
        shown = client.get("/api/v1/services/rt").json()
        assert [r["state"] for r in shown["replica_list"]] == ["unreachable", "ready"]
        assert shown["ready_replicas"] == 1
        for n in range(3):  # until its next call, it is sent nothing
            assert client.post(PREDICT, json={"inputs": [n]}).status_code == 200
        assert (len(dying.requests), len(alive.requests)) == (1, 5)

        # ready again, it is sent predictions; an answer begun then cut is not sent again
        ready(rt, job, dying.url, rank=0)
        mode["answer"] = "begun"
        got = [client.post(PREDICT, json={"inputs": [n]}) for n in range(2)]
        assert sorted(r.status_code for r in got) == [200, 502], [r.text for r in got]
        cut = next(r for r in got if r.status_code == 502)
        assert "closed the connection before its answer ended" in error_of(cut)["message"]
        assert (len(dying.requests), len(alive.requests)) == (2, 6)

        # with no other replica ready, the dropped request fails as it did (502)
        mode["answer"] = "none"
        ready(rt, job, dying.url, rank=0)
        ready(rt, job, "http://127.0.0.1:1024", rank=1)  # where nothing listens
        alone = client.post(PREDICT, json={"inputs": [1]})
        assert alone.status_code == 502, alone.text
        assert "before any byte of its answer" in error_of(alone)["message"]
        shown = client.get("/api/v1/services/rt").json()
        assert shown["stats"]["errors_total"] == 2


def test_a_replica_that_hangs_answers_502_past_the_timeout(
    api: tuple[TestClient, Runtime, Job],
    replica: Callable[[Handler], FakeReplica],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def hangs(r: FakeReplica, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(reader)
        await asyncio.sleep(60)

    monkeypatch.setattr(replicahub, "ANSWER_TIMEOUT", 0.5)  # read when the pool is made
    client, rt, job = api
    ready(rt, job, replica(hangs).url)
    late = client.post(PREDICT, json={"inputs": [1]})
    assert late.status_code == 502, late.text
    assert "did not answer within 0.5 s" in error_of(late)["message"]


def test_cross_site_requests_and_oversized_bodies_never_reach_a_replica(
    api: tuple[TestClient, Runtime, Job], replica: Callable[[Handler], FakeReplica]
) -> None:
    client, rt, job = api
    fake = answering(rt, job, replica)
    cross_origin(page_request(client, "POST", PREDICT, json={"inputs": [1]}, headers=CROSS_SITE))
    cross_origin(page_request(client, "POST", PREDICT, json={"inputs": [1]}))  # no sign at all
    rebound = client.post(PREDICT, json={"inputs": [1]}, headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and error_of(rebound)["code"] == "unknown_host"
    declared = client.post(PREDICT, content=b" " * (PREDICT_LIMIT + 1))
    assert declared.status_code == 413 and error_of(declared)["code"] == "too_large"
    assert "8 MiB" in error_of(declared)["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it is read
        for _ in range(PREDICT_LIMIT // (1 << 20) + 2):
            yield b" " * (1 << 20)

    streamed = client.post(PREDICT, content=chunks())
    assert streamed.status_code == 413, streamed.text
    assert "stopped after reading" in error_of(streamed)["message"]
    assert fake.requests == []
    assert client.post(PREDICT, json={"inputs": [1]}).status_code == 200  # from the CLI, say
    assert len(fake.requests) == 1


def test_the_lean_path_keeps_the_token_rules_and_roles(
    team: Team, replica: Callable[[Handler], FakeReplica]
) -> None:
    rt = team.rt
    job = make_service(rt)
    fake = answering(rt, job, replica)
    body = {"inputs": [1]}
    for user in ("vera", "alice", "root"):  # a viewer predicts as members and admins do
        resp = team.post(user, "/services/rt/predict", json=body)
        assert resp.status_code == 200 and resp.content == OK, (user, resp.text)
        assert rt.auth.cached(team.tokens[user]) is not None  # the next one needs no query
    assert team.post("vera", "/services/rt/predict", json=body).status_code == 200
    refused(team.api.post(PREDICT, json=body), 401)
    wrong = team.api.post(PREDICT, json=body, headers={"Authorization": "Bearer thu_guess"})
    assert "token was refused" in refused(wrong, 401)
    # a job's credential reaches its own job only, never a service
    credential = job_token(job.id)
    rt.store.jobs.update(job.id, token_hash=hash_token(credential))
    as_job = team.api.post(PREDICT, json=body, headers={"Authorization": f"Bearer {credential}"})
    assert "a job's credential reaches only its own job" in refused(as_job, 403)
    # the dashboard's cookie: with the CSRF header only (a form of another page has none)
    team.api.cookies.set(COOKIE, team.tokens["vera"])
    try:
        sneaky = page_request(
            team.api, "POST", PREDICT, json=body, headers={"Sec-Fetch-Site": "same-origin"}
        )
        assert f"must carry the {CSRF_HEADER}: 1 header" in refused(sneaky, 403)
        own = team.api.post(PREDICT, json=body)
        assert own.status_code == 200, own.text
    finally:
        team.api.cookies.clear()
    assert len(fake.requests) == 5  # the refused ones never reached it
    audit = team.get("root", "/audit", params={"action": "auth.failure"}).json()
    assert audit["total"] == 1  # the wrong token (no token at all is no failed use of one)
