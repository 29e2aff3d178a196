"""Logs: a rank's log as text (with the time each line was written, filtered by a pattern),
every rank's interleaved in the order written, and a live Server-Sent Events stream.

``GET /jobs/{id}/logs`` answers a rank's log from a byte offset (``X-Log-Offset`` says where to
go on) or its last lines; ``timestamps=true`` starts each line with when it was written (the
rank wrapper's time index, :mod:`trainhouse.jobfs.joblogs`), ``grep=PATTERN`` keeps the lines a
regular expression matches, and ``rank=all`` interleaves every rank's lines (with ``tail``, each
rank's last ones) by time, each with its rank (``[rank 1] ``). With either filter only whole
lines are answered: a line still being written waits for the next read (but the last one of
an ended job).

``GET /jobs/{id}/logs/stream`` sends ``log`` events, ``{"rank": "0", "text": ..., "offset": N}``
where ``offset`` is where that rank's log continues, and ``id:`` lines carrying every rank's
offset (``0:1234,1:88``), so a client that lost the connection (a server restart, a flaky
network) resumes exactly where it left off with ``from=`` or the standard ``Last-Event-ID``
header. Ranks that start writing later join the stream. Once the job has ended and every log has
been read to its end, an ``end`` event carries the final state and the stream closes.
Logs are sent as written: ANSI colour codes survive.

With auth on, the stream checks its caller's token again every :data:`RECHECK_SECONDS` (as a
new request would: revoked, expired, a disabled user, a job credential whose attempt ended, a
job the caller may no longer read); once it no longer works, an ``error`` event
(``{"status", "code", "message"}``) ends the stream. A user has at most
``Settings.log_streams_per_user`` streams open, the server ``Settings.log_streams``; past
either the request answers 429.

The files are read by :mod:`trainhouse.usecases.logs`; these routes parse, call, and frame the
answer (the stream's events, its slot, its rechecks).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials

from trainhouse.core.errors import TrainhouseError
from trainhouse.core.records import Job
from trainhouse.server.auth import bearer, caller, client_address, readable_job, request_token
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import NO_NUL, LogRanksOut
from trainhouse.usecases import logs as uc
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
RECHECK_SECONDS = 5.0  # an open stream checks its caller's token again this often


@router.get("/jobs/{job_id}/logs/ranks", response_model=LogRanksOut)
def log_ranks(job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)) -> LogRanksOut:
    found = uc.ranks(rt, job)
    return LogRanksOut(job_id=job.id, ranks=found.ranks, launcher=found.launcher)


@router.get("/jobs/{job_id}/logs", response_class=PlainTextResponse)
def logs(
    job: Job = Depends(readable_job),
    rank: str = Query(
        "0",
        pattern=r"^(\d{1,6}|launcher|all)$",
        description="A rank, 'launcher', or 'all' (every rank's lines interleaved by time)",
    ),
    offset: int = Query(0, ge=0),
    tail: int | None = Query(None, ge=0, le=100_000),
    timestamps: bool = Query(False, description="Start each line with when it was written"),
    grep: str | None = Query(
        None,
        max_length=uc.MAX_PATTERN,
        pattern=NO_NUL,
        description="Only the lines this regular expression matches",
    ),
    rt: Runtime = Depends(runtime),
) -> PlainTextResponse:
    """A rank's log as text; the ``X-Log-Offset`` header is where to continue reading (see
    the module docstring for ``timestamps``, ``grep`` and ``rank=all``)."""
    found = uc.text(rt, job, rank=rank, offset=offset, tail=tail, timestamps=timestamps, grep=grep)
    return PlainTextResponse(
        found.text, headers={"X-Job-State": str(job.state), "X-Log-Offset": str(found.offset)}
    )


def _event(kind: str, payload: object, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(payload)}\n\n"


@router.get("/jobs/{job_id}/logs/stream")
async def stream_logs(
    request: Request,
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
    p: Principal = Depends(caller),
    creds: HTTPAuthorizationCredentials | None = Depends(bearer),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """Follow a job's logs as Server-Sent Events (see the module docstring)."""
    job_id = job.id
    resume = from_ if from_ is not None else last_event_id
    stream = uc.follow(rt, job, ranks=rank, resume=resume, tail=tail)
    token = request_token(request, creds) if rt.auth.enabled else None
    client = client_address(request)
    settings = rt.settings

    def refusal() -> TrainhouseError | None:
        """Why the caller's token no longer reaches the job (None: it still does)."""
        return uc.refusal(rt, token, client, job_id)

    release = rt.streams.acquire(
        p.name, per_user=settings.log_streams_per_user, total=settings.log_streams
    )

    async def events() -> AsyncIterator[str]:
        try:
            async for event in follow():
                yield event
        finally:
            release()

    async def follow() -> AsyncIterator[str]:
        last_sent = time.monotonic()
        recheck = last_sent + RECHECK_SECONDS
        ended: str | None = None  # the final state, once seen: one more pass, then the end
        while True:
            if token is not None and time.monotonic() >= recheck:
                refused = await run_in_threadpool(refusal)
                if refused is not None:
                    error = {"status": refused.status, "code": refused.code}
                    yield _event("error", {**error, "message": str(refused)}, stream.ids())
                    return
                recheck = time.monotonic() + RECHECK_SECONDS
            sent = False
            for piece in stream.pieces():
                payload = {"rank": piece.rank, "text": piece.text, "offset": piece.offset}
                yield _event("log", payload, stream.ids())
                sent = True
            if sent:
                last_sent = time.monotonic()
                continue  # more may be waiting: read again before sleeping
            if ended is not None:
                yield _event("end", {"state": ended}, stream.ids())
                return
            final = await run_in_threadpool(stream.ended)
            if final is not None:
                ended = final  # what the ranks wrote just before: one more pass
                continue
            if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_sent = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)

    body = events()
    weakref.finalize(body, release)  # a stream whose body never started gives its slot back too
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
