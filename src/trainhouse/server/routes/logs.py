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
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import time
import weakref
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials

from trainhouse.core.errors import Forbidden, NotFound, SpecError, TrainhouseError
from trainhouse.jobfs.joblogs import Line, interleave, read_lines, read_log, stamp
from trainhouse.jobfs.layout import LAUNCHER, JobLayout
from trainhouse.server.auth import (
    bearer,
    caller,
    client_address,
    principal_of,
    readable_job,
    request_token,
)
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import NO_NUL, LogRanksOut
from trainhouse.store import Job
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
RECHECK_SECONDS = 5.0  # an open stream checks its caller's token again this often
CHUNK = 256 * 1024
# a rank as a stream names it: ASCII digits (str.isdigit() takes "²", which int() refuses),
# at most 7 (a job has at most 4096 x 1024 ranks), or the launcher
RANK = re.compile(r"[0-9]{1,7}|launcher")
OFFSET = re.compile(r"-?[0-9]{1,19}")


def rank_of(text: str) -> str | None:
    """``text`` as a rank (``"007"`` is ``"7"``), or None if it names none."""
    if not RANK.fullmatch(text):
        return None
    return text if text == "launcher" else str(int(text))


def parse_offsets(text: str | None) -> dict[str, int]:
    """``"0:1234,1:88"`` → ``{"0": 1234, "1": 88}``."""
    offsets: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        rank, sep, value = part.partition(":")
        name = rank_of(rank.strip())
        if not sep or name is None or not OFFSET.fullmatch(value.strip()):
            shown = part if len(part) <= 40 else part[:37] + "..."
            raise SpecError(f"offsets look like 0:1234,1:88; got {shown!r}")
        offsets[name] = max(0, int(value))
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


#: repetition inside a repeated group (``(a+)+``, ``(\w*)*``, ``(a|aa){2,}``): the patterns
#: that can take Python's regex engine exponential time on a hostile line, refused up front
NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[*+}](?:[^()\\]|\\.)*\)\s*[*+{]")
MAX_PATTERN = 200
ALL = "all"


def line_filter(pattern: str | None) -> re.Pattern[bytes] | None:
    """``grep``'s pattern compiled (a regular expression over the raw bytes of a line)."""
    if pattern is None or pattern == "":
        return None
    if NESTED_REPEAT.search(pattern):
        raise SpecError(
            f"grep pattern {pattern[:60]!r} repeats a group that repeats: such a pattern can "
            "take exponential time; write it without the nested repetition"
        )
    try:
        return re.compile(pattern.encode())
    except re.error as exc:
        raise SpecError(
            f"grep pattern {pattern[:60]!r} is not a regular expression: {exc}"
        ) from None


def render_lines(
    lines: list[tuple[str | None, Line]], *, timestamps: bool, grep: re.Pattern[bytes] | None
) -> str:
    """Lines as text: each prefixed with its time and its rank (when given), those ``grep``
    keeps."""
    out = []
    for rank, line in lines:
        if grep is not None and not grep.search(line.text):
            continue
        head = ""
        if not line.cont:
            if timestamps:
                head += stamp(line.time) + " "
            if rank is not None:
                head += f"[rank {rank}] "
        out.append(head + line.text.decode(errors="replace"))
    return "".join(out)


@router.get("/jobs/{job_id}/logs/ranks", response_model=LogRanksOut)
def log_ranks(job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)) -> LogRanksOut:
    files = rt.files(job.id)
    return LogRanksOut(job_id=job.id, ranks=files.ranks(), launcher=files.has_log(LAUNCHER))


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
        max_length=MAX_PATTERN,
        pattern=NO_NUL,
        description="Only the lines this regular expression matches",
    ),
    rt: Runtime = Depends(runtime),
) -> PlainTextResponse:
    """A rank's log as text; the ``X-Log-Offset`` header is where to continue reading (see
    the module docstring for ``timestamps``, ``grep`` and ``rank=all``)."""
    job_id = job.id
    world = job.spec.resources.world_size
    if rank not in ("launcher", ALL) and int(rank) >= world:
        raise NotFound(f"job {job_id} has ranks 0..{world - 1}; there is no rank {rank}")
    pattern = line_filter(grep)
    files = rt.files(job_id)
    headers = {"X-Job-State": str(job.state)}
    if rank == ALL:
        by_rank = {
            str(r): read_lines(files.log(r), files.log_times(r), within=files.home, tail=tail)[0]
            for r in files.ranks()
        }
        merged: list[tuple[str | None, Line]] = list(interleave(by_rank))
        text = render_lines(merged, timestamps=timestamps, grep=pattern)
        return PlainTextResponse(text, headers={**headers, "X-Log-Offset": "0"})
    if timestamps or pattern is not None:
        lines, nxt = read_lines(
            files.log(rank),
            files.log_times(rank),
            within=files.home,
            offset=offset,
            tail=tail,
            complete=not job.state.terminal,
        )
        text = render_lines([(None, ln) for ln in lines], timestamps=timestamps, grep=pattern)
        return PlainTextResponse(text, headers={**headers, "X-Log-Offset": str(nxt)})
    data, nxt = read_log(files.log(rank), within=files.home, offset=offset, tail=tail)
    return PlainTextResponse(
        data.decode(errors="replace"), headers={**headers, "X-Log-Offset": str(nxt)}
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
    world = job.spec.resources.world_size
    names = []
    for r in rank or []:
        name = rank_of(r)
        if name is None:
            shown = r if len(r) <= 20 else r[:17] + "..."
            raise SpecError(f"rank must be a rank (up to 7 digits 0-9) or launcher, got {shown!r}")
        if name != "launcher" and int(name) >= world:
            raise NotFound(f"job {job_id} has ranks 0..{world - 1}; there is no rank {name}")
        names.append(name)
    offsets = parse_offsets(from_ if from_ is not None else last_event_id)
    files = rt.files(job_id)
    token = request_token(request, creds) if rt.auth.enabled else None
    client = client_address(request)
    settings = rt.settings

    def refusal() -> TrainhouseError | None:
        """Why the caller's token no longer reaches the job (None: it still does)."""
        try:
            now = principal_of(rt, token, client)
            if not now.may_read(rt.store.jobs.get(job_id), settings.job_visibility):
                raise Forbidden(f"{now.name!r} may no longer read job {job_id}")
        except TrainhouseError as exc:
            return exc
        return None

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
        readers: dict[str, _Reader] = {}

        def wanted() -> list[str]:
            return names if names else [str(r) for r in files.ranks()]

        def ids() -> str:
            return ",".join(f"{r}:{rd.offset}" for r, rd in readers.items())

        last_sent = time.monotonic()
        recheck = last_sent + RECHECK_SECONDS
        ended: str | None = None  # the final state, once seen: one more pass, then the end
        while True:
            if token is not None and time.monotonic() >= recheck:
                refused = await run_in_threadpool(refusal)
                if refused is not None:
                    error = {"status": refused.status, "code": refused.code}
                    yield _event("error", {**error, "message": str(refused)}, ids())
                    return
                recheck = time.monotonic() + RECHECK_SECONDS
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
            current = await run_in_threadpool(rt.store.jobs.get, job_id)
            if current.state.terminal:
                ended = str(current.state)  # what the ranks wrote just before: one more pass
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
