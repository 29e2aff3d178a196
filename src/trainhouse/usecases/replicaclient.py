"""The server's HTTP client of one service's replicas: keep-alive connections, a request written
as bytes made once per replica, the answer read by httptools' C parser (llhttp, uvicorn's).

Why not aiohttp's client, which forwarded predictions before: with the prediction path made
lean (:mod:`trainhouse.server.predict`), aiohttp was most of what the server still spent per
prediction: about 0.3-0.4 ms of CPU on the 2-core VM (a request object, a header multidict, a
response object and a stream reader per request), three times what uvicorn spends receiving
and answering it. This spends a parser's callbacks and one write.

A replica's app is trainhouse's own, but whatever answers on its port runs its model owner's
code (a loader), so every answer is hostile:

- it is read up to ``max_answer`` bytes (declared or sent): past that the request fails and
  its connection is closed, before the rest is read into memory;
- it must be one complete HTTP/1.1 message: a connection closed before its end, a malformed
  message, an informational status or an upgrade fail the request (and close the connection),
  as does a redirect, which is never followed (it would send the prediction and the replica's
  key anywhere), and a status the server could not pass on with a body (204, 205, 304, or
  past 599);
- bytes that answer no request (a second answer) close the connection: the next request on it
  would read them as its own;
- each request is bounded by ``answer_timeout`` (waiting for a connection included), each new
  connection by ``connect_timeout``.

A connection that cannot be made is :class:`Unreachable` (the replica never got the request:
the caller may try another); a replica that fails while answering is :class:`Failed`, and
:class:`Dropped` (a kind of it) when its connection ended, closed or reset, before a byte of its
answer came: the replica died with the request, or closed a kept-alive connection as it was
sent, and a prediction (which changes nothing) may be sent again. Past a byte of an answer, a
timeout, or any hostile answer, it is never :class:`Dropped`. Idle
connections are reused newest first and dropped after :data:`IDLE_SECONDS`, below the 5 s a
replica's uvicorn keeps an idle connection open, so a request is not written into a connection
its replica is closing. At most ``connections`` are open at once (in use or idle): one
service's hung replicas hold its own connections, never another service's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import cast

import httptools

from trainhouse.core.modelfiles import BATCH_HEADER, REPLICA_KEY_HEADER

__all__ = ["IDLE_SECONDS", "Answer", "Dropped", "Failed", "ReplicaClient", "Unreachable"]

#: an idle connection older than this is closed rather than reused (uvicorn: 5 s keep-alive)
IDLE_SECONDS = 4.0
_BATCH = BATCH_HEADER.lower().encode()
_LENGTH = b"content-length"
#: a body up to this size is written with its head in one write (one segment); a larger one
#: after it, uncopied
_ONE_WRITE = 1 << 16
#: statuses whose answer has no body: passed on with the replica's body, they would not parse
_NO_BODY = frozenset({204, 205, 304})


class Unreachable(Exception):
    """No connection to the replica could be made: it never got the request."""


class Failed(Exception):
    """The replica failed while answering; the message says how."""


class Dropped(Failed):
    """The replica's connection ended (closed or reset) before any byte of its answer: it
    read the request, or some of it, and said nothing (it died, or closed a kept-alive
    connection as the request went out)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    batch: int  # the examples of the batch it ran in (the replica's header); 0 if not said


@dataclass(frozen=True)
class _Target:
    """A replica's address and the head of every request to it, made once."""

    host: str
    port: int
    head: bytes  # up to ``Content-Length: ``

    @classmethod
    def of(cls, url: str, key: str) -> _Target:
        host, _, port = url.removeprefix("http://").rpartition(":")
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if not all(0x21 <= ord(c) <= 0x7E for c in authority + key):  # both checked already
            raise Failed("its address or key would not fit in a request's head")
        head = (
            f"POST /predict HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n"
            f"{REPLICA_KEY_HEADER}: {key}\r\nContent-Length: "
        )
        return cls(host, int(port), head.encode("ascii"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica; one request at a time."""

    def __init__(self, client: ReplicaClient, url: str) -> None:
        self.client = client
        self.url = url
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = 0.0  # the loop's time by which the answer in flight must have ended
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.batch = b""
        self.complete = False
        self.keep_alive = False  # read with the head: the parser resets it with each message
        self.problem: str | None = None
        self.answered = False  # a byte of the answer came
        self.dropped = False  # the connection ended before one did

    # -- asyncio's side ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.fail("sent bytes that answer no request")
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.problem = self.problem or "answered with a protocol upgrade"
        except httptools.HttpParserError as exc:
            self.problem = self.problem or f"answered with a malformed HTTP message ({exc})"
        if self.problem is not None:
            self.fail(self.problem)
        elif self.complete:
            self.waiter.set_result(None)

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client._lost(self)
        if self.waiter is not None and not self.waiter.done() and not self.answered:
            self.dropped = self.problem is None
            how = "reset" if isinstance(exc, ConnectionResetError) else "closed"
            self.fail(f"{how} the connection before any byte of its answer")
            return
        self.fail("closed the connection before its answer ended")

    # -- the parser's callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:  # a second message, whole or begun, after the answer
            self._refuse("answered twice")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)  # most headers are neither: no lower-cased copy for them
        if size == len(_BATCH) and name.lower() == _BATCH:
            self.batch = value
        elif size == len(_LENGTH) and name.lower() == _LENGTH:
            declared = value.strip()
            if declared.isdigit() and int(declared) > self.client.max_answer:
                self._refuse(f"answered with over {self.client.max_answer} bytes")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.parser.should_upgrade():
            self._refuse("answered with a protocol upgrade")
        elif 300 <= self.status < 400:  # followed, it would send the request anywhere
            self._refuse("answered with a redirect, which is not followed")
        elif self.status < 200:
            self._refuse(f"answered with the informational status {self.status}")
        elif self.status in _NO_BODY or self.status > 599:  # a client could not read it after
            self._refuse(f"answered with the status {self.status}, which is not passed on")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.client.max_answer:
            self._refuse(f"answered with over {self.client.max_answer} bytes")
        elif self.problem is None:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def _refuse(self, problem: str) -> None:
        """The answer fails with ``problem`` (the first one found: what follows from it, such
        as a 204's body read as a second answer, says less)."""
        self.problem = self.problem or problem

    # -- the client's side -------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes, deadline: float) -> Answer:
        """Send a request (``head`` and ``body``); its answer, or :class:`Failed`."""
        assert self.transport is not None
        self._reset()
        self.deadline = deadline
        self.waiter = waiter = asyncio.get_running_loop().create_future()
        if len(body) <= _ONE_WRITE:
            self.transport.write(head + body)  # one segment, one system call
        else:
            self.transport.writelines((head, body))  # no copy of a large body
        try:
            await waiter
        finally:
            self.waiter = None
        if self.problem is not None:
            raise (Dropped if self.dropped else Failed)(self.problem)
        batch = int(self.batch) if self.batch.isdigit() else 0
        body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        return Answer(self.status, body, batch)

    def reusable(self) -> bool:
        return not self.closed and self.complete and self.keep_alive

    def fail(self, problem: str) -> None:
        """End the request in flight, if any, with ``problem``, and the connection."""
        if self.waiter is not None and not self.waiter.done():
            self.problem = self.problem or problem
            self.waiter.set_result(None)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class ReplicaClient:
    """The keep-alive connections of one service's predictions to its replicas."""

    def __init__(
        self,
        *,
        connections: int,
        connect_timeout: float,
        answer_timeout: float,
        max_answer: int,
    ) -> None:
        self.connections = connections
        self.connect_timeout = connect_timeout
        self.answer_timeout = answer_timeout
        self.max_answer = max_answer
        self._slots = asyncio.Semaphore(connections)
        self._idle: dict[str, list[_Connection]] = {}  # url -> idle connections, newest last
        self._open: set[_Connection] = set()
        self._targets: dict[tuple[str, str], _Target] = {}
        self._watchdog: asyncio.Task[None] | None = None

    async def post(self, url: str, key: str, body: bytes) -> Answer:
        """``POST /predict`` with ``body`` and ``key`` to the replica at ``url``
        (``http://HOST:PORT``): its answer; :class:`Unreachable`, or :class:`Failed` (past
        ``answer_timeout`` too) if none."""
        target = self._targets.get((url, key))
        if target is None:
            if len(self._targets) > 4 * self.connections:  # replicas come and go
                self._targets.clear()
            target = self._targets[url, key] = _Target.of(url, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.answer_timeout
        if self._watchdog is None:  # one timer for every request, not one per request
            self._watchdog = loop.create_task(self._expire())
        if self._slots.locked():  # every connection busy: wait for one, within the deadline
            try:
                async with asyncio.timeout_at(deadline):
                    await self._slots.acquire()
            except TimeoutError:
                raise Failed(self._late) from None
        else:
            await self._slots.acquire()
        try:
            conn = self._reuse(url) or await self._connect(url, target)
            try:
                answer = await conn.exchange(
                    target.head + b"%d\r\n\r\n" % len(body), body, deadline
                )
            except BaseException:  # failed, canceled: the connection is not reused
                conn.close()
                raise
            if conn.reusable():
                conn.idle_since = time.monotonic()
                self._idle.setdefault(url, []).append(conn)
            else:
                conn.close()
            return answer
        finally:
            self._slots.release()

    @property
    def _late(self) -> str:
        return f"did not answer within {self.answer_timeout:g} s"

    async def _expire(self) -> None:
        """Fail every request past its deadline (checked a few times per ``answer_timeout``,
        at least once a second)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, self.answer_timeout / 4))
            now = loop.time()
            for conn in [c for c in self._open if c.waiter is not None and c.deadline <= now]:
                conn.fail(self._late)

    def _reuse(self, url: str) -> _Connection | None:
        idle = self._idle.get(url)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            closing = conn.closed or conn.transport is None or conn.transport.is_closing()
            if not closing and now - conn.idle_since < IDLE_SECONDS:
                return conn
            conn.close()
        return None

    async def _connect(self, url: str, target: _Target) -> _Connection:
        if len(self._open) >= self.connections:  # the slot held: at least one is idle
            self._close_oldest_idle()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, url), target.host, target.port
                )
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"{url}: {type(exc).__name__}: {exc}") from None
        self._open.add(conn)
        return conn

    def _close_oldest_idle(self) -> None:
        oldest: _Connection | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].idle_since < oldest.idle_since):
                oldest = idle[0]
        if oldest is not None:
            self._idle[oldest.url].remove(oldest)
            oldest.close()
            self._open.discard(oldest)

    def _lost(self, conn: _Connection) -> None:
        self._open.discard(conn)

    async def close(self) -> None:
        """Close every connection and stop the watchdog (the server's shutdown)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        for conn in list(self._open):
            conn.fail("the server is stopping")
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # the transports' connection_lost run
