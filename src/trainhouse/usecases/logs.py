"""Logs: a job's log files read for a caller who may read the job: which ranks have one, a
rank's log as text (from a byte offset or its last lines, with the time each line was written,
filtered by a pattern), every rank's interleaved in the order written, and the pieces a live
stream sends (:class:`LogFollow`). The files are read through
:mod:`trainhouse.jobfs.joblogs` from the server's home, never more than :data:`CHUNK` bytes at
a time for a stream; the HTTP side (``server/routes/logs.py``) frames them and holds the
stream's slot."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from dataclasses import dataclass

from trainhouse.core.errors import Forbidden, NotFound, SpecError, TrainhouseError
from trainhouse.core.records import Job
from trainhouse.jobfs.joblogs import (
    MAX_READ,
    MAX_TIMES,
    Line,
    interleave,
    read_lines,
    read_log,
    stamp,
)
from trainhouse.jobfs.layout import LAUNCHER, JobLayout
from trainhouse.usecases import callers
from trainhouse.usecases.runtime import Runtime

__all__ = [
    "ALL",
    "CHUNK",
    "MAX_PATTERN",
    "LogFollow",
    "LogRanks",
    "LogText",
    "follow",
    "line_filter",
    "parse_offsets",
    "rank_of",
    "ranks",
    "refusal",
    "render_lines",
    "text",
]

CHUNK = 256 * 1024  # bytes of one rank's log a stream reads at a time
# a rank as a stream names it: ASCII digits (str.isdigit() takes "²", which int() refuses),
# at most 7 (a job has at most 4096 x 1024 ranks), or the launcher
RANK = re.compile(r"[0-9]{1,7}|launcher")
OFFSET = re.compile(r"-?[0-9]{1,19}")
#: repetition inside a repeated group (``(a+)+``, ``(\w*)*``, ``(a|aa){2,}``): the patterns
#: that can take Python's regex engine exponential time on a hostile line, refused up front
NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[*+}](?:[^()\\]|\\.)*\)\s*[*+{]")
MAX_PATTERN = 200
ALL = "all"
#: bytes of a rank's log (and of its time index) that ``rank=all`` reads at the least
MIN_SHARE = 64 << 10


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


@dataclass(frozen=True)
class LogRanks:
    """The ranks that have a log, and whether the launcher has one."""

    ranks: list[int]
    launcher: bool


def ranks(rt: Runtime, job: Job) -> LogRanks:
    """Which of ``job``'s logs exist (a job the caller may read)."""
    files = rt.files(job.id)
    return LogRanks(ranks=files.ranks(), launcher=files.has_log(LAUNCHER))


@dataclass(frozen=True)
class LogText:
    """Log text as answered, and the byte offset where the next read continues (0 for
    ``rank=all``, which has no one offset)."""

    text: str
    offset: int


def text(
    rt: Runtime,
    job: Job,
    *,
    rank: str = "0",
    offset: int = 0,
    tail: int | None = None,
    timestamps: bool = False,
    grep: str | None = None,
) -> LogText:
    """A rank's log (a rank, ``launcher``, or :data:`ALL`: every rank's lines interleaved by
    time, each with its rank) from ``offset`` or its last ``tail`` lines; ``timestamps``
    starts each line with when it was written, ``grep`` keeps the lines a regular expression
    matches. With either, only whole lines are answered (but the last one of an ended job)."""
    job_id = job.id
    world = job.spec.resources.world_size
    if rank not in ("launcher", ALL) and int(rank) >= world:
        raise NotFound(f"job {job_id} has ranks 0..{world - 1}; there is no rank {rank}")
    pattern = line_filter(grep)
    files = rt.files(job_id)
    if rank == ALL:
        # the job's own ranks only (it may leave any number of rank-N.log files), and the
        # bytes of one read shared among them, the time indexes' likewise
        real = [r for r in files.ranks() if int(r) < world]
        share = max(MIN_SHARE, MAX_READ // max(1, len(real)))
        times_share = max(MIN_SHARE, MAX_TIMES // max(1, len(real)))
        by_rank = {
            str(r): read_lines(
                files.log(r),
                files.log_times(r),
                within=files.home,
                tail=tail,
                limit=share,
                times_limit=times_share,
            )[0]
            for r in real
        }
        merged: list[tuple[str | None, Line]] = list(interleave(by_rank))
        return LogText(render_lines(merged, timestamps=timestamps, grep=pattern), 0)
    if timestamps or pattern is not None:
        lines, nxt = read_lines(
            files.log(rank),
            files.log_times(rank),
            within=files.home,
            offset=offset,
            tail=tail,
            complete=not job.state.terminal,
        )
        shown = render_lines([(None, ln) for ln in lines], timestamps=timestamps, grep=pattern)
        return LogText(shown, nxt)
    data, nxt = read_log(files.log(rank), within=files.home, offset=offset, tail=tail)
    return LogText(data.decode(errors="replace"), nxt)


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


@dataclass(frozen=True)
class Piece:
    """Text a rank wrote, and the offset where its log continues after it."""

    rank: str
    text: str
    offset: int


class LogFollow:
    """A job's logs as a live stream reads them: the ranks asked for (default every rank,
    those that start writing later too), each from its offset (or its last ``tail`` lines).
    :meth:`pieces` is one pass over them; :meth:`ids` says where every rank's log continues
    (``0:1234,1:88``), what a client resumes from."""

    def __init__(
        self,
        rt: Runtime,
        job: Job,
        names: list[str],
        offsets: dict[str, int],
        tail: int | None,
    ) -> None:
        self.rt = rt
        self.job_id = job.id
        self.names = names
        self.offsets = offsets
        self.tail = tail
        self._files = rt.files(job.id)
        self._readers: dict[str, _Reader] = {}

    def _wanted(self) -> list[str]:
        return self.names if self.names else [str(r) for r in self._files.ranks()]

    def ids(self) -> str:
        """Every rank's offset so far: ``0:1234,1:88``."""
        return ",".join(f"{r}:{rd.offset}" for r, rd in self._readers.items())

    def pieces(self) -> Iterator[Piece]:
        """What the ranks wrote since the last pass, rank by rank, in pieces of at most
        :data:`CHUNK` bytes (a rank new to the stream starts at its offset, or with its last
        ``tail`` lines when it has none)."""
        for r in self._wanted():
            if r not in self._readers:
                reader = self._readers[r] = _Reader(self._files, r, self.offsets.get(r, 0))
                if self.tail is not None and r not in self.offsets:
                    got = reader.tail(self.tail)
                    if got:
                        yield Piece(r, got, reader.offset)
            reader = self._readers[r]
            while got := reader.read():
                yield Piece(r, got, reader.offset)

    def ended(self) -> str | None:
        """The job's final state once it has ended (None while it runs)."""
        current = self.rt.store.jobs.get(self.job_id)
        return str(current.state) if current.state.terminal else None


def follow(
    rt: Runtime,
    job: Job,
    *,
    ranks: list[str] | None = None,
    resume: str | None = None,
    tail: int | None = None,
) -> LogFollow:
    """A stream of ``job``'s logs (a job the caller may read): ``ranks`` (a rank or
    ``launcher``; default every rank's), each from its offset in ``resume`` (``0:1234,1:88``,
    :func:`parse_offsets`) or, for a rank not there, from its last ``tail`` lines (None: its
    start)."""
    world = job.spec.resources.world_size
    names = []
    for r in ranks or []:
        name = rank_of(r)
        if name is None:
            shown = r if len(r) <= 20 else r[:17] + "..."
            raise SpecError(f"rank must be a rank (up to 7 digits 0-9) or launcher, got {shown!r}")
        if name != "launcher" and int(name) >= world:
            raise NotFound(f"job {job.id} has ranks 0..{world - 1}; there is no rank {name}")
        names.append(name)
    return LogFollow(rt, job, names, parse_offsets(resume), tail)


def refusal(rt: Runtime, token: str | None, client: str, job_id: int) -> TrainhouseError | None:
    """Why ``token`` (from ``client``) no longer reaches job ``job_id``, as a new request
    would be refused (revoked, expired, a disabled user, a job credential whose attempt
    ended, a job the caller may no longer read); None while it still does."""
    try:
        now = callers.principal_of(rt, token, client)
        if not now.may_read(rt.store.jobs.get(job_id), rt.settings.job_visibility):
            raise Forbidden(f"{now.name!r} may no longer read job {job_id}")
    except TrainhouseError as exc:
        return exc
    return None
