"""The clients of bench/load.py (one asyncio task and connection per job) and the count of
what the server stored against what they sent; see bench/load.py's docstring."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
import sqlalchemy

from trainhouse.core.wire import CLIENT_HEADERS, JSON_HEADERS, encode_json
from trainhouse.sdk._metrics import Point, as_columns

REQUEST_TIMEOUT = 120.0  # seconds: a slow answer is measured, not turned into an error


# -- the clients -----------------------------------------------------------------------------
@dataclass
class ClientResult:
    job_id: int
    latencies: list[float] = field(default_factory=list)  # seconds, 2xx answers
    acked: list[int] = field(default_factory=list)  # step blocks acknowledged
    unacked: list[int] = field(default_factory=list)  # step blocks sent, never acknowledged
    accepted: int = 0  # the sum of the answers' "accepted"
    errors: int = 0  # failed requests (transport errors, 5xx), each retried
    refused: int = 0  # 4xx answers (not retried: the benchmark is wrong)
    messages: list[str] = field(default_factory=list)
    last_answer: float = 0.0  # perf_counter of the last answer


def batch_body(attempt: int, block: int, names: list[str], steps: int) -> bytes:
    """One report: ``steps`` consecutive steps of every series, as the SDK encodes it."""
    wall = time.time()
    points: list[Point] = [
        (step, name, step * 1e-3 + i, None, wall)
        for step in range(block * steps, (block + 1) * steps)
        for i, name in enumerate(names)
    ]
    payload = {"batch_id": uuid.uuid4().hex, "attempt": attempt, "columns": as_columns(points)}
    return encode_json(payload)


class Connection:
    """One keep-alive HTTP/1.1 connection, written by hand: the requests httpx would send, at
    a fraction of its CPU (the clients share the machine with the server they measure)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        fixed = {"Host": f"{self.host}:{self.port}", **headers}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """(status, body); OSError or asyncio.IncompleteReadError on a transport error (the
        next request opens a new connection)."""
        try:
            return await asyncio.wait_for(self._request(method, path, body), REQUEST_TIMEOUT)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            await self.close()
            raise

    async def _request(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\n{self.head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status = int((await self.reader.readline()).split(b" ", 2)[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        answer = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, answer


def error_message(status: int, body: bytes) -> str:
    try:
        return f"HTTP {status}: {orjson.loads(body)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:200]!r}"


async def one_client(
    url: str,
    launch: dict[str, Any],
    names: list[str],
    steps: int,
    ready: asyncio.Queue[None],
    go: asyncio.Event,
    clock: dict[str, float],
    retry_for: float,
) -> ClientResult:
    result = ClientResult(int(launch["job_id"]))
    headers = {"Authorization": f"Bearer {launch['token']}", **JSON_HEADERS, **CLIENT_HEADERS}
    http = Connection(url, headers)
    path = f"/api/v1/jobs/{result.job_id}/report"
    try:
        try:  # open the connection before the clock starts
            status, _ = await http.request("GET", "/api/v1/health")
            if status != 200:
                raise RuntimeError(f"GET /api/v1/health answered {status}")
        finally:
            ready.put_nowait(None)  # a failure surfaces from gather(), not as a hang
        await go.wait()
        block = 0
        while time.perf_counter() < clock["deadline"]:
            body = batch_body(int(launch["attempt"]), block, names, steps)
            give_up = clock["deadline"] + retry_for
            delay = 0.1
            while True:
                began = time.perf_counter()
                problem = ""
                try:
                    status, answer = await http.request("POST", path, body)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    now = time.perf_counter()
                    if status < 300:
                        result.latencies.append(now - began)
                        result.accepted += int(orjson.loads(answer)["accepted"])
                        result.acked.append(block)
                        result.last_answer = now
                        break
                    problem = error_message(status, answer)
                    if status < 500:
                        result.refused += 1
                        result.unacked.append(block)
                        result.messages.append(problem)
                        return result  # a refusal is a bug of the benchmark or the server
                result.errors += 1
                if len(result.messages) < 5:
                    result.messages.append(problem)
                if time.perf_counter() + delay > give_up:
                    result.unacked.append(block)
                    return result
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            block += 1
    finally:
        await http.close()
    return result


async def drive(
    url: str,
    launches: dict[int, dict[str, Any]],
    series: int,
    steps: int,
    duration: float,
    retry_for: float,
) -> tuple[list[ClientResult], float, float]:
    """Every client at once for ``duration`` s; (results, start, end) in perf_counter time."""
    names = [f"metric_{i:02d}" for i in range(series)]
    ready: asyncio.Queue[None] = asyncio.Queue()
    go = asyncio.Event()
    clock = {"deadline": math.inf}
    tasks = [
        asyncio.create_task(one_client(url, launch, names, steps, ready, go, clock, retry_for))
        for launch in launches.values()
    ]
    for _ in tasks:
        await ready.get()
    start = time.perf_counter()
    clock["deadline"] = start + duration
    go.set()
    results = await asyncio.gather(*tasks)
    end = max([r.last_answer for r in results] + [start + 1e-9])
    return list(results), start, end


# -- counting --------------------------------------------------------------------------------
def stored_blocks(db_url: str, job_ids: list[int], steps: int) -> dict[tuple[int, int], int]:
    """(job, step block) -> points stored, by SQL on the server's database."""
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sqlalchemy.text(
                    "SELECT job_id, step / :steps AS block, count(*) FROM metrics "
                    "WHERE job_id >= :lo AND job_id <= :hi GROUP BY job_id, step / :steps"
                ),
                {"steps": steps, "lo": min(job_ids), "hi": max(job_ids)},
            ).all()
    finally:
        engine.dispose()
    return {(int(j), int(b)): int(n) for j, b, n in rows}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def count(
    results: list[ClientResult],
    stored: dict[tuple[int, int], int],
    api_totals: dict[int, int],
    per_request: int,
) -> dict[str, Any]:
    acked_points = lost = unacked_points = unacked_stored = 0
    for r in results:
        acked_points += per_request * len(r.acked)
        lost += sum(per_request - stored.get((r.job_id, b), 0) for b in r.acked)
        unacked_points += per_request * len(r.unacked)
        unacked_stored += sum(stored.get((r.job_id, b), 0) for b in r.unacked)
    sent_blocks = {(r.job_id, b) for r in results for b in (*r.acked, *r.unacked)}
    unexpected = sum(n for key, n in stored.items() if key not in sent_blocks)
    sql_totals: dict[int, int] = {}
    for (job, _), n in stored.items():
        sql_totals[job] = sql_totals.get(job, 0) + n
    mismatched = {
        job: (api_totals.get(job, 0), sql_totals.get(job, 0))
        for job in {r.job_id for r in results}
        if api_totals.get(job, 0) != sql_totals.get(job, 0)
    }
    return {
        "acknowledged_points": acked_points,
        "accepted_points": sum(r.accepted for r in results),
        "stored_points": sum(stored.values()),
        "lost_points": lost,
        "unacknowledged_points": unacked_points,
        "unacknowledged_stored": unacked_stored,
        "unexpected_points": unexpected,
        "api_mismatch": {str(k): v for k, v in sorted(mismatched.items())},
    }
