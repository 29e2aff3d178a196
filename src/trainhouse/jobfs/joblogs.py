"""Reading a job's logs: byte ranges for followers, the last lines for failure reports, and
lines with the time each was written (the rank wrapper's time index next to each rank's log,
``rank-N.log.times``: a record per piece it copied, the piece's offset and arrival time).

Logs are written by the job's processes (:mod:`trainhouse.jobfs.layout` says where), so they are
opened through :mod:`trainhouse.jobfs.jobfiles` from the trusted directory ``within`` (the server's
home, a Ray node agent's directory): a log that is a link (or lies under one), a FIFO, a socket,
a directory or a hard-linked file reads as empty, and the open never waits. The server reads
them through here, never more than ``limit`` bytes at a time. Standard library only.
"""

from __future__ import annotations

import bisect
import math
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from trainhouse.jobfs import jobfiles

__all__ = [
    "MAX_READ",
    "Line",
    "interleave",
    "read_lines",
    "read_log",
    "read_times",
    "stamp",
    "time_at",
]

MAX_READ = 4 << 20  # bytes one read returns at most


def read_log(
    path: Path,
    *,
    within: Path,
    offset: int = 0,
    tail: int | None = None,
    limit: int = MAX_READ,
) -> tuple[bytes, int]:
    """Bytes of a log from ``offset`` (or its last ``tail`` lines); returns (data, next).

    ``path`` lies under ``within``, the directory the job cannot replace. A log that does not
    exist (yet), or that is not a regular file reached without a link, reads as empty, at
    offset 0.
    """
    try:
        fh = jobfiles.open_file(within, path)
    except OSError:
        return b"", 0
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if tail is not None:
            start = max(0, size - max(tail, 1) * 512 - 65536)
            fh.seek(start)
            data = fh.read(size - start)
            lines = data.splitlines(keepends=True)
            if start > 0 and lines:
                lines = lines[1:]  # a partial first line
            return b"".join(lines[-tail:] if tail > 0 else []), size
        offset = min(max(offset, 0), size)
        fh.seek(offset)
        data = fh.read(min(limit, size - offset))
        return data, offset + len(data)


# -- lines with the time each was written ------------------------------------------------------
TIME_RECORD = struct.Struct("<qd")  # the rank wrapper's: (byte offset in the log, wall time)
MAX_TIMES = 32 << 20  # bytes of a time index read at most: its last 2M pieces


@dataclass(frozen=True)
class Line:
    """A line of a log (its newline kept, if it has one), when its first byte was written
    (None: not known, a log without a time index), and whether it continues a line begun
    before the bytes that were read (``cont``)."""

    text: bytes
    time: float | None
    cont: bool = False


def read_times(path: Path, *, within: Path, limit: int = MAX_TIMES) -> list[tuple[int, float]]:
    """A log's time index (its last ``limit`` bytes) as (offset, time) by offset; empty when
    there is none or it is not a regular file reached without a link."""
    try:
        fh = jobfiles.open_file(within, path)
    except OSError:
        return []
    with fh:
        size = os.fstat(fh.fileno()).st_size
        size -= size % TIME_RECORD.size  # a record being written is left for the next read
        start = max(0, size - limit + limit % TIME_RECORD.size)
        fh.seek(start)
        data = fh.read(size - start)
    return [TIME_RECORD.unpack_from(data, i) for i in range(0, len(data), TIME_RECORD.size)]


def time_at(index: list[tuple[int, float]], offset: int) -> float | None:
    """When the byte at ``offset`` was written: the time of the piece that holds it."""
    i = bisect.bisect_right(index, (offset, math.inf)) - 1
    return index[i][1] if i >= 0 else None


def read_lines(
    path: Path,
    times: Path,
    *,
    within: Path,
    offset: int = 0,
    tail: int | None = None,
    limit: int = MAX_READ,
    times_limit: int = MAX_TIMES,
    complete: bool = False,
) -> tuple[list[Line], int]:
    """The lines of a log from ``offset`` (or its last ``tail``) with the time each was
    written (from the time index ``times``, its last ``times_limit`` bytes); returns (lines,
    next offset). ``complete``: a last line without its newline is left for the next read
    (``next`` stops before it)."""
    data, nxt = read_log(path, within=within, offset=offset, tail=tail, limit=limit)
    start = nxt - len(data)
    cont = False
    if start > 0 and data:
        before, _ = read_log(path, within=within, offset=start - 1, limit=1)
        cont = before != b"\n"
    chunks = data.splitlines(keepends=True)
    if complete and chunks and not chunks[-1].endswith(b"\n"):
        nxt -= len(chunks.pop())
    index = read_times(times, within=within, limit=times_limit) if chunks else []
    lines = []
    at = start
    for i, chunk in enumerate(chunks):
        lines.append(Line(chunk, time_at(index, at), cont=cont and i == 0))
        at += len(chunk)
    return lines, nxt


def stamp(at: float | None) -> str:
    """``2026-12-01T21:58:27.123Z`` (UTC, milliseconds); dashes when not known."""
    if at is None:
        return "-" * 24
    whole = time.gmtime(at)
    return time.strftime("%Y-%m-%dT%H:%M:%S", whole) + f".{int(at % 1 * 1000):03d}Z"


def interleave(by_rank: dict[str, list[Line]]) -> list[tuple[str, Line]]:
    """Every rank's lines in one list, in the order they were written (a line whose time is
    not known keeps its place after its rank's previous one; ties: by rank)."""
    keyed = []
    for order, (rank, lines) in enumerate(by_rank.items()):
        last = -math.inf
        for pos, line in enumerate(lines):
            if line.time is not None:
                last = line.time
            keyed.append(((last, order, pos), rank, line))
    keyed.sort(key=lambda k: k[0])
    return [(rank, line) for _, rank, line in keyed]
