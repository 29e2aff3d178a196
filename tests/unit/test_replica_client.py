"""The server's client of a service's replicas (``trainhouse.usecases.replicaclient``) against
raw sockets that answer whatever a test writes: keep-alive connections reused and bounded, the
request as sent (the body unparsed, the replica's key), and every answer a hostile replica can
give (chunked, twice, malformed, a redirect, too large, closed early, never) turned into a
failure of that request alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from trainhouse.core.modelfiles import REPLICA_KEY_HEADER
from trainhouse.usecases import replicaclient
from trainhouse.usecases.replicaclient import Dropped, Failed, ReplicaClient, Unreachable

KEY = "k" * 24
OK = b'{"outputs": [[1.0]], "model": "m", "version": 1}'
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(body: bytes = OK, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nx-trainhouse-batch: 7\r\n"
        f"{extra}content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: its head and its body (the client always sends a Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


class Replica:
    """A loopback server running ``handler`` on each connection; what it saw."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test ended (a handler may sleep)
        finally:
            self.open -= 1
            writer.close()


@asynccontextmanager
async def replica(handler: Handler) -> AsyncIterator[Replica]:
    found = Replica(handler)
    server = await asyncio.start_server(found.serve, "127.0.0.1", 0)
    found.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield found
    finally:
        server.close()
        for writer in found.writers:  # the connections too: the replica is gone
            writer.close()
        await server.wait_closed()


def client(**kw: Any) -> ReplicaClient:
    values: dict[str, Any] = {
        "connections": 8,
        "connect_timeout": 2.0,
        "answer_timeout": 10.0,
        "max_answer": 1 << 20,
    }
    return ReplicaClient(**{**values, **kw})


def answering(*answers: bytes, seen: list[tuple[bytes, bytes]] | None = None) -> Handler:
    """A handler that answers each request on a connection with the next of ``answers`` (the
    last one again once they run out)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(10_000):
            request = await read_request(reader)
            if seen is not None:
                seen.append(request)
            writer.write(answers[min(i, len(answers) - 1)])
            await writer.drain()

    return handle


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_requests_go_as_sent_on_one_kept_alive_connection() -> None:
    seen: list[tuple[bytes, bytes]] = []
    raw = b'{"inputs": [[1, 2,  3]]}  \n'  # passed on as it came, never parsed

    async def scenario() -> None:
        http = client()
        async with replica(answering(answer(), seen=seen)) as r:
            for _ in range(5):
                got = await http.post(r.url, KEY, raw)
                assert (got.status, got.body, got.batch) == (200, OK, 7)
            assert r.connections == 1  # kept alive, reused
        await http.close()

    run(scenario)
    head, body = seen[0]
    assert body == raw
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /predict HTTP/1.1"
    assert f"{REPLICA_KEY_HEADER}: {KEY}" in lines
    assert "Content-Type: application/json" in lines
    assert f"Content-Length: {len(raw)}" in lines
    assert len(seen) == 5


def test_a_chunked_answer_and_a_replica_status_come_back_whole() -> None:
    chunked = (
        b"HTTP/1.1 422 Unprocessable Entity\r\ntransfer-encoding: chunked\r\n\r\n"
        b'5\r\n{"a":\r\n3\r\n 1}\r\n0\r\n\r\n'
    )

    async def scenario() -> None:
        http = client()
        async with replica(answering(chunked)) as r:
            got = await http.post(r.url, KEY, b"{}")
            assert (got.status, got.body, got.batch) == (422, b'{"a": 1}', 0)
            again = await http.post(r.url, KEY, b"{}")
            assert again.body == b'{"a": 1}' and r.connections == 1
        await http.close()

    run(scenario)


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (answer() + answer(), "answered twice"),
        (answer() + b"HTTP/1.1 200", "answered twice"),  # a second answer begun
        (b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n", "malformed HTTP message"),
        (b"NOT HTTP AT ALL\r\n\r\n", "malformed HTTP message"),
        (answer(status="307 Temporary Redirect", extra="location: /x\r\n"), "a redirect"),
        (
            answer(status="101 Switching Protocols", extra="connection: upgrade\r\nupgrade: x\r\n"),
            "protocol upgrade",
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "informational status 100"),
        (answer(status="204 No Content"), "status 204, which is not passed on"),
        (answer(status="799 Odd"), "status 799, which is not passed on"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{", "before its answer ended"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n", "over 4096 bytes"),
        (answer(b"x" * 5000), "over 4096 bytes"),
    ],
)
def test_a_hostile_answer_fails_its_request_and_its_connection(reply: bytes, says: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        if reply.endswith(b"{"):  # closed before the end of what it said it would send
            return
        await asyncio.sleep(5)

    async def scenario() -> None:
        http = client(max_answer=4096)
        async with replica(handle) as r:
            with pytest.raises(Failed, match=says) as failed:
                await http.post(r.url, KEY, b"{}")
            assert not isinstance(failed.value, Dropped)  # an answer came: never sent again
            with pytest.raises(Failed, match=says):  # on a new connection, not the spoilt one
                await http.post(r.url, KEY, b"{}")
            assert r.connections == 2
        await http.close()

    run(scenario)


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A replica that reads the request and never answers."""
    await read_request(reader)
    await asyncio.sleep(30)


@pytest.mark.parametrize("reset", [True, False])
def test_a_connection_that_ends_before_any_answer_is_dropped(reset: bool) -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if reset:
            writer.transport.abort()
        else:
            writer.close()

    async def scenario() -> None:
        http = client(answer_timeout=0.3)
        async with replica(dies) as r:
            with pytest.raises(Dropped, match="before any byte of its answer"):
                await http.post(r.url, KEY, b"{}")
        async with replica(silent) as r:  # silent past the timeout: not dropped, it may be busy
            with pytest.raises(Failed) as failed:
                await http.post(r.url, KEY, b"{}")
            assert not isinstance(failed.value, Dropped)
        await http.close()

    run(scenario)


def test_an_answer_that_closes_its_connection_is_not_reused() -> None:
    async def scenario() -> None:
        http = client()
        async with replica(answering(answer(extra="connection: close\r\n"))) as r:
            for _ in range(3):
                assert (await http.post(r.url, KEY, b"{}")).body == OK
            assert r.connections == 3
        await http.close()

    run(scenario)


def test_an_idle_connection_is_dropped_before_its_replica_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replicaclient, "IDLE_SECONDS", 0.05)

    async def scenario() -> None:
        http = client()
        async with replica(answering(answer())) as r:
            await http.post(r.url, KEY, b"{}")
            await asyncio.sleep(0.1)
            await http.post(r.url, KEY, b"{}")
            assert r.connections == 2
        await http.close()

    run(scenario)


def test_connections_are_bounded_and_a_closed_one_is_not_reused() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(answer())
            await writer.drain()

    async def scenario() -> None:
        http = client(connections=2)
        async with replica(slow) as r:
            got = await asyncio.gather(*(http.post(r.url, KEY, b"{}") for _ in range(8)))
            assert [a.status for a in got] == [200] * 8
            assert r.most_open <= 2 and r.connections == 2
        # the replica went away: its idle connections are closed, the next is refused
        await asyncio.sleep(0.05)
        with pytest.raises(Unreachable):
            await http.post(r.url, KEY, b"{}")
        await http.close()

    run(scenario)


def test_a_replica_that_never_answers_fails_past_the_timeout() -> None:
    async def scenario() -> None:
        http = client(answer_timeout=0.3)
        async with replica(silent) as r:
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(Failed, match=r"did not answer within 0\.3 s"):
                await http.post(r.url, KEY, b"{}")
            assert loop.time() - began < 3
        await http.close()

    run(scenario)


def test_bytes_that_answer_no_request_close_an_idle_connection() -> None:
    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer())
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(answer())  # nobody asked
        await writer.drain()
        while True:
            await read_request(reader)
            writer.write(answer())
            await writer.drain()

    async def scenario() -> None:
        http = client()
        async with replica(chatty) as r:
            assert (await http.post(r.url, KEY, b"{}")).body == OK
            await asyncio.sleep(0.2)
            assert (await http.post(r.url, KEY, b"{}")).body == OK
            assert r.connections == 2  # the first was closed for the unasked answer
        await http.close()

    run(scenario)
