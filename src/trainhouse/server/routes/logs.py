"""Live logs: a Server-Sent Events stream of every rank's log, resumable from byte offsets.

``GET /jobs/{id}/logs/stream`` sends ``log`` events, ``{"rank": "0", "text": ..., "offset": N}``
where ``offset`` is where that rank's log continues, and ``id:`` lines carrying every rank's
offset (``0:1234,1:88``), so a client that lost the connection (a server restart, a flaky
network) resumes exactly where it left off with ``from=`` or the standard ``Last-Event-ID``
header. Ranks that start writing later join the stream. Once the job has ended and every log has
been read to its end, an ``end`` event carries the final state and the stream closes.
Logs are sent as written: ANSI colour codes survive.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from trainhouse.errors import NotFound, SpecError
from trainhouse.joblogs import read_log
from trainhouse.layout import JobLayout
from trainhouse.server.auth import readable_job
from trainhouse.server.deps import Services, services
from trainhouse.store import Job

router = APIRouter(tags=["jobs"])

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
CHUNK = 256 * 1024


def parse_offsets(text: str | None) -> dict[str, int]:
    """``"0:1234,1:88"`` → ``{"0": 1234, "1": 88}``."""
    offsets: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        rank, sep, value = part.partition(":")
        try:
            if not sep or not (rank.strip() == "launcher" or rank.strip().isdigit()):
                raise ValueError
            offsets[rank.strip()] = max(0, int(value))
        except ValueError:
            raise SpecError(f"offsets look like 0:1234,1:88; got {part!r}") from None
    return offsets


class _Reader:
    """One rank's log, read incrementally; never splits a UTF-8 character."""

    def __init__(self, files: JobLayout, rank: str, offset: int) -> None:
        self.files = files
        self.rank = rank
        self.offset = offset  # bytes sent so far (complete characters only)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._read_to = offset

    def read(self) -> str:
        data, nxt = read_log(
            self.files.log(self.rank), within=self.files.home, offset=self._read_to, limit=CHUNK
        )
        if not data:
            return ""
        self._read_to = nxt
        text = self._decoder.decode(data)
        pending = len(self._decoder.getstate()[0])
        self.offset = nxt - pending
        return text

    def tail(self, lines: int) -> str:
        data, size = read_log(self.files.log(self.rank), within=self.files.home, tail=lines)
        self._read_to = self.offset = size
        return data.decode(errors="replace")


def _event(kind: str, payload: object, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(payload)}\n\n"


@router.get("/jobs/{job_id}/logs/stream")
async def stream_logs(
    job: Job = Depends(readable_job),
    rank: Annotated[list[str] | None, Query(description="Ranks to follow; default all")] = None,
    from_: Annotated[
        str | None,
        Query(alias="from", max_length=10_000, description="Offsets to resume from: 0:1234,1:88"),
    ] = None,
    tail: Annotated[
        int | None, Query(ge=0, le=100_000, description="Start at the last N lines")
    ] = None,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", include_in_schema=False)
    ] = None,
    svc: Services = Depends(services),
) -> StreamingResponse:
    """Follow a job's logs as Server-Sent Events (see the module docstring)."""
    job_id = job.id
    world = job.spec.resources.world_size
    for r in rank or []:
        if r != "launcher" and (not r.isdigit() or int(r) >= world):
            raise NotFound(f"job {job_id} has ranks 0..{world - 1}; there is no rank {r}")
    offsets = parse_offsets(from_ if from_ is not None else last_event_id)
    files = svc.files(job_id)

    async def events() -> AsyncIterator[str]:
        readers: dict[str, _Reader] = {}

        def wanted() -> list[str]:
            return list(rank) if rank else [str(r) for r in files.ranks()]

        def ids() -> str:
            return ",".join(f"{r}:{rd.offset}" for r, rd in readers.items())

        last_sent = time.monotonic()
        ended: str | None = None  # the final state, once seen: one more pass, then the end
        while True:
            sent = False
            for r in wanted():
                if r not in readers:
                    readers[r] = _Reader(files, r, offsets.get(r, 0))
                    if tail is not None and r not in offsets:
                        text = readers[r].tail(tail)
                        if text:
                            payload = {"rank": r, "text": text, "offset": readers[r].offset}
                            yield _event("log", payload, ids())
                            sent = True
                while text := readers[r].read():
                    payload = {"rank": r, "text": text, "offset": readers[r].offset}
                    yield _event("log", payload, ids())
                    sent = True
            if sent:
                last_sent = time.monotonic()
                continue  # more may be waiting: read again before sleeping
            if ended is not None:
                yield _event("end", {"state": ended}, ids())
                return
            current = await run_in_threadpool(svc.store.jobs.get, job_id)
            if current.state.terminal:
                ended = str(current.state)  # what the ranks wrote just before: one more pass
                continue
            if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_sent = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
