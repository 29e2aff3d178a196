"""The metric buffer: ``run.log`` appends in memory; a background thread flushes batches.

One HTTP request per flush, never one per point, and the training loop never waits on the
network. A flush sends up to ``max_batch`` points as one orjson-encoded report; the server
stores a full batch in one transaction (``trainhouse.store.metrics``). A batch keeps its id
until the server accepts it, so a retried batch is stored once.
Points the server could not take by the end of the run (it was down) are spooled to the attempt's
directory; the server stores them when it records the attempt's end, under the same batch ids.

A checkpoint must never become visible to a resume before every point logged before it is
durable: its registration carries them (:meth:`Reporter.register_with_points`: one request,
the server stores them first), and where the server cannot take the points now it asks
:meth:`Reporter.persist` to spool them (fsynced) first. Spooled batches stay first in line and
are sent under their own ids once the server answers (their files removed once stored); a rank
killed before that leaves them for the server to store when it records the attempt's end.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhouse.core.errors import ClientError, ServerUnreachable
from trainhouse.core.wire import encode_json
from trainhouse.sdk._transport import JobAPI

log = logging.getLogger("trainhouse")

Point = tuple[int, str, float | None, int | None, float]
MAX_SERVER_ERRORS = 10  # a batch the server fails on this many times in a row is dropped
BUSY = 503  # the server cannot take a report now (a full queue): never counted as a failure
#: points a checkpoint's registration carries at most (the route takes 1 MiB); more are
#: reported on their own first
FOLD_POINTS = 10_000


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


_FIELDS = [operator.itemgetter(i) for i in range(5)]


@dataclass
class _Batch:
    """Points sent as one report, under one id until the server stores them."""

    id: str
    points: list[Point]
    spooled: Path | None = None  # its spool file, once it has one


def as_columns(points: list[Point]) -> dict[str, Any]:
    """Points as the report's five lists: the server parses five JSON arrays of numbers and
    strings much faster than an array per point."""
    steps, names, values, ranks, walls = (list(map(_FIELDS[i], points)) for i in range(5))
    return {"step": steps, "name": names, "value": values, "rank": ranks, "wall_time": walls}


class Reporter:
    """A rank's metric buffer and the thread that sends it (see the module's docstring).

    ``spool`` is the directory for the points the server could not take by the end (the
    attempt's ``metrics-spool``), or None to log them as lost. ``stop_requested`` is set once the
    server answers a report with a stop request.
    """

    def __init__(
        self,
        api: JobAPI,
        attempt: int,
        *,
        interval: float = 1.0,
        heartbeat: float = 2.0,
        max_batch: int = 50_000,
        spool: Path | None = None,
    ) -> None:
        self.api = api
        self.attempt = attempt
        self.interval = interval
        self.heartbeat = heartbeat
        self.max_batch = max_batch
        self.spool = spool
        self.total_steps: int | None = None
        # set on resume: the server drops steps after it that earlier attempts logged
        self.resume_step: int | None = None
        self._failures = 0
        self.stop_requested = threading.Event()
        self.stop_reason: str | None = None
        self.sent_points = 0
        self._buffer: list[Point] = []
        # batches formed and not stored yet, in the order they are sent (the first may be in
        # flight); only the flush lock's holder takes from it
        self._batches: deque[_Batch] = deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.RLock()  # register_with_points may flush under it
        self._kick = threading.Event()
        self._closed = threading.Event()
        self._last_sent = 0.0
        self._failing = False
        self._total_sent: int | None = None
        self._deferred: list[dict[str, Any]] = []  # checkpoints to register once it answers
        self._thread = threading.Thread(target=self._loop, name="trainhouse-metrics", daemon=True)
        self._thread.start()

    def add(self, points: list[Point]) -> None:
        with self._lock:
            self._buffer.extend(points)
            full = len(self._buffer) >= self.max_batch
        if full and not self._kick.is_set():  # set() takes a lock: not at every call
            self._kick.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._kick.wait(self.interval)
            self._kick.clear()
            if self._closed.is_set():
                break
            try:
                self.flush()
            except ClientError as exc:
                if not self._failing:  # once per outage, not once a second
                    log.warning("trainhouse: metrics not sent yet (%s); retrying", exc)
                self._failing = True
            else:
                if self._failing:
                    log.warning("trainhouse: the server answers again; buffered metrics sent")
                self._failing = False

    def defer_checkpoint(self, record: dict[str, Any]) -> None:
        """Register ``record`` with the server once it answers, after every metric point
        buffered so far is stored (a run resumed from it must not miss a step)."""
        with self._lock:
            self._deferred.append(record)
        self._kick.set()

    @property
    def deferred_checkpoints(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._deferred)

    def flush(self, *, retry_for: float = 0.0) -> None:
        """Send everything buffered (and a heartbeat when due), then deferred checkpoints."""
        with self._flush_lock:
            self._send_points(retry_for)
            while True:
                with self._lock:
                    if not self._deferred:
                        return
                    record = self._deferred[0]
                try:
                    self.api.register_checkpoint(record, retry_for=retry_for)
                except ClientError as exc:
                    if isinstance(exc, ServerUnreachable) or exc.status >= 500:
                        raise
                    log.error(
                        "trainhouse: the server refused checkpoint %s: %s", record["path"], exc
                    )
                else:
                    log.warning("trainhouse: checkpoint %s registered", record["path"])
                with self._lock:
                    self._deferred.pop(0)

    def register_with_points(
        self, record: dict[str, Any], *, retry_for: float = 0.0
    ) -> dict[str, Any]:
        """Register the checkpoint ``record`` in one request with the points logged before it:
        the server stores them first, then registers it (a run resumed from it misses no step
        it logged before), and answers as a report does too. One request per checkpoint, not
        two (a flush, then the registration).

        When batches wait in line (the server was away), checkpoints wait to be registered,
        or more than :data:`FOLD_POINTS` points are owed, it flushes, then registers, as
        before. A ClientError leaves the points in line (the caller spools them).

        While the server is away (the metric thread's last flush failed, or registrations
        already wait for it) it raises :class:`ServerUnreachable` at once: each checkpoint of
        an outage waited ``retry_for`` (5 s) for a server the last one had found gone, and the
        training loop with it. The checkpoint then waits in line behind the earlier ones."""
        with self._lock:
            away = self._failing or bool(self._deferred)
        if away:
            raise ServerUnreachable(self.api.url, "it did not answer the last flush")
        with self._flush_lock:
            with self._lock:
                owed = len(self._buffer)
                alone = not self._deferred
            if self._batches or not alone or owed > FOLD_POINTS:
                self.flush(retry_for=retry_for)  # takes the flush lock again: it is reentrant
                return self.api.register_checkpoint(record, retry_for=retry_for)
            if not owed:  # nothing to store before it
                return self.api.register_checkpoint(record, retry_for=retry_for)
            batch = _Batch(uuid.uuid4().hex, self._take_buffer(owed))
            self._batches.append(batch)
            payload = self._payload(batch)
            folded = {**record, "report": payload}
            answer = dict(self.api.register_checkpoint(folded, retry_for=retry_for))
            reported = answer.pop("report", None)
            if not isinstance(reported, dict):  # a server that ignores the points it was sent
                self._send_points(retry_for)
                return answer
            if self.resume_step == payload["resume_step"]:
                self.resume_step = None  # applied
            self._stored(batch)
            self._last_sent = time.monotonic()
            self._total_sent = payload["total_steps"]
            self.sent_points += len(batch.points)
            if reported.get("stop"):
                self.stop_reason = reported.get("stop_reason")
                self.stop_requested.set()
            return answer

    def _take_buffer(self, limit: int | None = None) -> list[Point]:
        """At most ``max_batch`` (and ``limit``) of the buffered points, taken out of the
        buffer."""
        size = self.max_batch if limit is None else min(limit, self.max_batch)
        with self._lock:
            if len(self._buffer) <= size:  # the usual case: no copying
                points, self._buffer = self._buffer, []
            else:
                points = self._buffer[:size]
                del self._buffer[:size]
        return points

    def _payload(self, batch: _Batch) -> dict[str, Any]:
        return {
            "batch_id": batch.id,
            "attempt": self.attempt,
            "columns": as_columns(batch.points),
            "total_steps": self.total_steps,
            "resume_step": self.resume_step,
        }

    def _stored(self, batch: _Batch) -> None:
        """The server stored ``batch``: it leaves the line (and the spool)."""
        self._batches.popleft()
        if batch.spooled is not None:
            with contextlib.suppress(OSError):
                batch.spooled.unlink()

    def _send_points(self, retry_for: float) -> None:
        """Send the batches in line, then the points buffered when it was called, in batches of
        at most ``max_batch`` (and a heartbeat when one is due).

        Points logged while it sends are left for the next flush: a flush that sent them too
        would go on for as long as the loop logs a step faster than a report's round trip (the
        flush before each checkpoint kept reporting through most of the next epoch)."""
        with self._lock:
            owed = len(self._buffer)  # only the flush lock's holder takes from the buffer
        if not self._batches and not owed:
            due = time.monotonic() - self._last_sent >= self.heartbeat
            if not due and self.total_steps == self._total_sent:
                return
            self._batches.append(_Batch(uuid.uuid4().hex, []))
        while True:
            if not self._batches:
                if not owed:
                    return
                points = self._take_buffer(owed)
                owed -= len(points)
                self._batches.append(_Batch(uuid.uuid4().hex, points))
            batch = self._batches[0]
            points = batch.points
            payload = self._payload(batch)
            try:
                answer = self.api.report(payload, retry_for=retry_for)
            except ClientError as exc:
                if exc.status == BUSY:  # the server's queue is full: the batch is fine, resend
                    raise
                self._failures += 1
                if 400 <= exc.status < 500 or (
                    exc.status >= 500 and self._failures >= MAX_SERVER_ERRORS
                ):  # retrying cannot help: drop it, or nothing after it gets through
                    log.error("trainhouse: server refused %d metric points: %s", len(points), exc)
                    self._stored(batch)
                    self._failures = 0
                    return
                raise
            self._failures = 0
            if self.resume_step == payload["resume_step"]:
                self.resume_step = None  # applied
            self._stored(batch)
            self._last_sent = time.monotonic()
            self._total_sent = payload["total_steps"]
            self.sent_points += len(points)
            if answer.get("stop"):
                self.stop_reason = answer.get("stop_reason")
                self.stop_requested.set()

    def persist(self) -> bool:
        """Make every point logged so far durable now, without the server: the batches in line
        and the buffer are written to the spool (fsynced) and stay first in line, to be sent
        under their ids once the server answers. False when there is no spool or it cannot be
        written (then nothing logged since the last report is durable)."""
        with self._flush_lock:  # the metric thread sends nothing meanwhile
            while points := self._take_buffer():
                self._batches.append(_Batch(uuid.uuid4().hex, points))
            return self._spool_batches()

    def _spool_batches(self) -> bool:
        """Write each batch in line that has no spool file yet (fsynced, renamed into place)."""
        unwritten = [b for b in self._batches if b.spooled is None and b.points]
        if not unwritten:
            return True
        if self.spool is None:
            return False
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            for batch in unwritten:
                final = self.spool / f"{time.time_ns():020d}-{batch.id}.json"
                tmp = final.with_name(f".{final.name}.tmp")
                with tmp.open("wb") as fh:
                    fh.write(encode_json(self._payload(batch)))
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, final)
                batch.spooled = final
            fd = os.open(self.spool, os.O_RDONLY)  # the renames are durable too
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("trainhouse: cannot spool metrics to %s: %s", self.spool, exc)
            return False
        return True

    def close(self, timeout: float = 15.0) -> None:
        self._closed.set()
        self._kick.set()
        self._thread.join(timeout=timeout)
        try:
            self.flush(retry_for=timeout)
        except ClientError as exc:
            with self._flush_lock:
                while points := self._take_buffer():
                    self._batches.append(_Batch(uuid.uuid4().hex, points))
                kept = self._spool_batches()
                lost = sum(len(b.points) for b in self._batches)
            if kept and lost:
                log.warning(
                    "trainhouse: the server is unreachable (%s); %d metric points are kept in %s "
                    "and stored when the server records the end of this attempt",
                    exc,
                    lost,
                    self.spool,
                )
            elif lost:
                log.error("trainhouse: could not send %d metric points: %s", lost, exc)
