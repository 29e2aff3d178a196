"""TensorBoard event files imported as metrics (and media) while a job runs.

Every job's processes get ``TRAINHOUSE_TENSORBOARD_DIR`` (``HOME/jobs/<id>/tensorboard``,
:mod:`trainhouse.jobfs.layout`). This service looks there every ``interval`` seconds for each
running job on this machine, reads the new records of every event file (``*tfevents*``, in the
directory or below it: TFRecord framing checked by its CRCs, then the tensorboard package's own
read-time compat layers, ``data_compat`` and ``dataclass_compat``, which also migrate TF1
summaries), and stores each scalar as a point of the job's series named by its tag (``train/loss``;
a file in a subdirectory ``sub/`` gives ``sub/train/loss``), at the event's step, through the report
path (:mod:`trainhouse.ingest.groupcommit`): a step logged again replaces the value. Images
and histograms become the job's media (:mod:`trainhouse.ingest.tbmedia`, checked as the SDK's
are, stored :data:`MAX_MEDIA_PER_TICK` at a time, at most :data:`MAX_MEDIA_PER_JOB_TICK` of a
job a tick: the next tick reads on). When a job stops running, its files are read one last
time (over as many ticks as its media take).

Where each file was read to is kept in the store (``store.event_files``): the byte offset after
the last record whose points are all stored, written after each tick that moved it. A restarted
server reads each file on from there: no record is read twice (a record whose points were only
partly stored when the server stopped aside: it is read again, its steps replacing themselves),
none is skipped. A file shorter than its position (replaced) is read from its start. A tag's
metadata that only the file's first record carried (``dataclass_compat``) is not known past a
restart: TF2's tensor scalars after it are passed over as before the first record was read.

The files are the job's, so hostile: each is opened through :mod:`trainhouse.jobfs.jobfiles`
(walked from the home without following a link, a regular file with one link) and read through
that descriptor only, however the path changes; a file past :data:`MAX_EVENT_FILE` bytes, one
the reader fails on (a record failing its CRC, a length field past the file's bound) and one
beyond :data:`MAX_FILES` are left (said once in the server's log); at most
:data:`MAX_POINTS_PER_TICK` points are taken from a job per tick (the rest on the next). The
reader is an optional extra (``pip install trainhouse[tensorboard]``): without it the service
does not run.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import stat
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.errors import InvalidMedia
from trainhouse.core.lifecycle import JobState
from trainhouse.core.media import Prepared
from trainhouse.core.reports import INT64, MAX_NAME, Columns, Report, check_columns
from trainhouse.ingest.groupcommit import Refused, ReportWriter
from trainhouse.ingest.tbmedia import media_item
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import JobLayout
from trainhouse.store import Job, Store
from trainhouse.store.eventfiles import path_key

__all__ = ["TensorBoardImport", "available"]

log = logging.getLogger(__name__)

#: an event file's bytes at most (a larger one is left where it stopped)
MAX_EVENT_FILE = 256 << 20
#: event files of one job read at most
MAX_FILES = 256
#: directory levels below the job's TensorBoard directory
MAX_DEPTH = 8
#: points taken from one job per tick
MAX_POINTS_PER_TICK = 100_000
#: points per report handed to the group commit
REPORT_POINTS = 10_000
#: a point read: step, name, value, wall time, its file, where its record starts in the file
_Point = tuple[int, str, float | None, float, str, int]
#: images and histograms read from one file before they are stored (then the next few)
MAX_MEDIA_PER_TICK = 16
#: images and histograms of one job read in a tick (each image is inflated to be checked: a
#: job with thousands would hold every other job's import); the next tick reads on
MAX_MEDIA_PER_JOB_TICK = 256


def available() -> bool:
    """Whether the tensorboard package (its event reader) is installed."""
    return importlib.util.find_spec("tensorboard") is not None


class _Loader:
    """The events of one opened (and checked) file from a byte offset: TFRecord framing (a
    length and its masked CRC-32C, the record and its own), then TensorBoard's read-time compat
    layers. ``offset`` is where the next record starts, ``start`` where the last one read
    began. A record not complete yet (the writer mid-write) is read at a later call; a CRC that
    fails, or a length past :data:`MAX_EVENT_FILE`, raises ``ValueError`` (nothing allocated)."""

    def __init__(self, fh: BinaryIO, offset: int = 0) -> None:
        self.fh = fh
        self.offset = self.start = offset
        self.records = 0  # records read by this loader
        self._metadata: dict[str, Any] = {}  # dataclass_compat's: a tag's first metadata

    def _record(self, size: int) -> bytes | None:
        """The next record of a file of ``size`` bytes (None: none complete yet)."""
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

        self.fh.seek(self.offset)  # within the read buffer: no system call
        header = self.fh.read(12)
        if len(header) < 12:
            return None
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
            raise ValueError(f"the record at byte {self.offset} fails its length's CRC")
        if length > MAX_EVENT_FILE:
            raise ValueError(f"a record of {length} bytes at byte {self.offset}")
        if self.offset + 12 + length + 4 > size:  # not all written yet: nothing read for it
            return None
        body = self.fh.read(length + 4)
        if len(body) < length + 4:
            return None
        data = body[:length]
        if struct.unpack("<I", body[length:])[0] != masked_crc32c(data):
            raise ValueError(f"the record at byte {self.offset} fails its CRC")
        self.start, self.offset = self.offset, self.offset + 12 + length + 4
        self.records += 1
        return data

    def events(self) -> Iterator[Any]:
        """The new events, read on from ``offset`` (stop iterating at any one)."""
        from tensorboard import data_compat, dataclass_compat
        from tensorboard.compat.proto import event_pb2

        size = os.fstat(self.fh.fileno()).st_size
        while (record := self._record(size)) is not None:
            event = data_compat.migrate_event(event_pb2.Event.FromString(record))
            yield from dataclass_compat.migrate_event(event, self._metadata)


@dataclass
class _File:
    fh: BinaryIO
    loader: _Loader
    prefix: str  # the subdirectory's path, with a trailing "/" (empty at the top)
    pending: list[_Point] = field(default_factory=list)
    media: list[Prepared] = field(default_factory=list)  # images and histograms read
    refused: list[str] = field(default_factory=list)  # why an image or histogram was not
    dead: bool = False
    saved: int = 0  # the position the store holds


@dataclass
class _JobFiles:
    #: each file's position the store held when this server began reading the job, by path key
    positions: dict[str, int]
    files: dict[str, _File] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    #: points read but not stored yet (the writer refused them): the first of the next tick
    unstored: list[_Point] = field(default_factory=list)
    #: a file stopped at the tick's bound on media: it is read on at the next tick
    more_media: bool = False


class TensorBoardImport(BackgroundLoop):
    name = "trainhouse-tensorboard"
    final_tick = True

    def __init__(
        self,
        store: Store,
        reports: ReportWriter,
        home: Path,
        *,
        interval: float = 2.0,
        on_stored: Callable[[Job, Columns], object] | None = None,
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.reports = reports
        self.home = home
        #: called with a search trial's job and the points stored for it (the pruner's feed)
        self.on_stored = on_stored
        self._lock = threading.Lock()  # the ticks, and attempt_ended from the scheduler
        self._jobs: dict[int, _JobFiles] = {}
        #: jobs that ended since this time may have events no tick has read yet
        self._since = time.time()
        #: jobs whose last events were read, with when they ended (not read twice)
        self._finished: dict[int, float] = {}

    @property
    def enabled(self) -> bool:
        return self.interval is not None and self.interval > 0 and available()

    def on_stop(self) -> None:
        for job_id in list(self._jobs):
            self._close(job_id)

    def attempt_ended(self, job_id: int) -> int:
        """What an attempt's processes wrote until they ended, read now (the scheduler calls
        this before it records the end): a job's metrics are complete once it has ended, not
        a tick later. Returns the points stored."""
        with self._lock:
            try:
                return self.import_job(self.store.jobs.get(job_id))
            except Exception:
                log.exception("TensorBoard import: job %s's events at its attempt's end", job_id)
                return 0

    def tick(self) -> int:
        """Import what every running job wrote since the last tick; returns points stored."""
        with self._lock:
            return self._tick()

    def _tick(self) -> int:
        # a second of slack: a job's end stamped before this tick may commit after its query
        since, self._since = self._since, time.time() - 1.0
        running = {j.id: j for j in self.store.jobs.list(states=[JobState.RUNNING])}
        stored = 0
        for job in running.values():
            self._finished.pop(job.id, None)
            stored += self.import_job(job)
        # jobs this loop was reading, and those that ran and ended between two ticks (a short
        # attempt, a busy server): their last points, written just before they ended
        ended = {
            j.id: j
            for j in self.store.jobs.list(ended_since=since)
            if j.id not in running and j.id not in self._jobs and j.id not in self._finished
        }
        for job_id in [j for j in self._jobs if j not in running] + list(ended):
            last = ended.get(job_id)
            try:
                last = last or self.store.jobs.get(job_id)
                stored += self.import_job(last)
            except Exception:
                log.exception("TensorBoard import: job %s's last events", job_id)
            state = self._jobs.get(job_id)
            if state is not None and (state.unstored or state.more_media):
                continue  # its last points (media) go at the next tick (it is still in _jobs)
            self._close(job_id)
            if last is not None and last.ended_at is not None:
                self._finished[job_id] = last.ended_at
        self._finished = {j: at for j, at in self._finished.items() if at >= since}
        return stored

    def _close(self, job_id: int) -> None:
        state = self._jobs.pop(job_id, None)
        if state is not None:
            for f in state.files.values():
                f.fh.close()

    # -- one job ------------------------------------------------------------------------------
    def import_job(self, job: Job) -> int:
        directory = JobLayout(self.home, job.id).tensorboard
        state = self._jobs.get(job.id)
        if state is None:
            state = self._jobs[job.id] = _JobFiles(self.store.event_files.get(job.id))
        self._discover(job.id, directory, state)
        points, state.unstored = state.unstored, []
        state.more_media = False
        media_left = MAX_MEDIA_PER_JOB_TICK
        for rel, f in sorted(state.files.items()):
            if f.dead:
                continue
            if media_left <= 0:  # the rest at the next tick
                state.more_media = True
                break
            room = MAX_POINTS_PER_TICK - len(points)
            try:
                while True:  # media are stored a few at a time: memory holds few images
                    self._read(f, rel, room)
                    more = len(f.media) >= MAX_MEDIA_PER_TICK and len(f.pending) < room
                    media_left -= len(f.media) + len(f.refused)
                    self._store_media(job, rel, f, state)
                    if more and media_left <= 0:
                        state.more_media = True
                    if not more or media_left <= 0:
                        break
            except Exception as exc:  # a hostile or corrupt file: left where it stopped
                f.dead = True
                log.warning("TensorBoard import: job %s's %s left: %s", job.id, rel, exc)
                self._store_media(job, rel, f, state)
            take = f.pending[:room]
            del f.pending[: len(take)]
            points.extend(take)
            if len(points) >= MAX_POINTS_PER_TICK:
                break
        stored, state.unstored = self._store(job, points)
        self._save_positions(job.id, state)
        return stored

    def _save_positions(self, job_id: int, state: _JobFiles) -> None:
        """Each file's position past the records whose points are all stored, where it moved
        (a store error: said, and written at a later tick)."""
        waiting: dict[str, int] = {}
        for point in state.unstored:
            waiting[point[4]] = min(point[5], waiting.get(point[4], point[5]))
        moved: dict[str, int] = {}
        for rel, f in state.files.items():
            position = min([f.loader.offset] + [p[5] for p in f.pending[:1]])
            position = min(position, waiting.get(rel, position))
            if position != f.saved:
                moved[rel] = position
        if not moved:
            return
        try:
            self.store.event_files.save(job_id, moved)
        except Exception as exc:
            log.info("TensorBoard import: job %s's read positions not saved yet: %s", job_id, exc)
            return
        for rel, position in moved.items():
            state.files[rel].saved = position

    def _discover(self, job_id: int, directory: Path, state: _JobFiles) -> None:
        if len(state.files) >= MAX_FILES:
            return
        try:
            with jobfiles.open_dir(self.home, directory) as top:
                found = _event_files(top, "", MAX_DEPTH, [4 * MAX_FILES])
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:  # the directory itself a link: said once
            if "walk" not in state.warned:
                state.warned.add("walk")
                log.warning("TensorBoard import: job %s's directory refused: %s", job_id, exc)
            return
        for rel in found:
            if rel in state.files:
                continue
            if len(state.files) >= MAX_FILES:
                log.warning("TensorBoard import: job %s has over %s event files", job_id, MAX_FILES)
                return
            try:
                fh = jobfiles.open_file(self.home, directory / rel)
            except OSError:
                continue
            position = state.positions.get(path_key(rel), 0)
            try:
                if position > os.fstat(fh.fileno()).st_size:  # replaced: read from its start
                    position = 0
            except OSError:
                fh.close()
                continue
            prefix = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
            state.files[rel] = _File(fh, _Loader(fh, position), prefix, saved=position)

    def _read(self, f: _File, rel: str, room: int) -> None:
        """Move the file's new scalars to ``f.pending`` (up to about ``room`` more)."""
        if len(f.pending) >= room:
            return
        size = os.fstat(f.fh.fileno()).st_size
        if size > MAX_EVENT_FILE:
            raise ValueError(f"the file is over {MAX_EVENT_FILE} bytes")
        for event in f.loader.events():
            if not event.HasField("summary"):
                continue
            step = int(event.step)
            if not 0 <= step <= INT64:
                continue
            wall = float(event.wall_time) or time.time()
            if not math.isfinite(wall):
                wall = time.time()
            for value in event.summary.value:
                name = (f.prefix + value.tag)[:MAX_NAME]
                if not name or "\x00" in name:
                    continue
                scalar = _scalar(value)
                if scalar is _NOT_SCALAR:
                    try:
                        item = media_item(value, name, step)
                    except InvalidMedia as exc:
                        f.refused.append(f"{name} at step {step}: {exc}")
                        continue
                    if item is not None:
                        f.media.append(item)
                    continue
                start = f.loader.start
                f.pending.append((step, name, scalar, wall, rel, start))  # type: ignore[arg-type]
            if len(f.pending) >= room or len(f.media) >= MAX_MEDIA_PER_TICK:
                break

    def _store_media(self, job: Job, rel: str, f: _File, state: _JobFiles) -> None:
        """The images and histograms read from one file, stored as the job's media; one
        refused (a bound, a PNG that is not one) is said in the server's log, once a key."""
        items, f.media = f.media, []
        refused, f.refused = f.refused, []
        for item in items:
            try:
                self.store.media.add(
                    job.id,
                    key=item.key,
                    step=item.step,
                    kind=item.kind,
                    data=item.data,
                    width=item.width,
                    height=item.height,
                )
            except InvalidMedia as exc:
                refused.append(f"{item.key} at step {item.step}: {exc}")
        for why in refused:
            key = "media:" + why.split(" at step ", 1)[0]
            if key not in state.warned:
                state.warned.add(key)
                log.warning("TensorBoard import: job %s's %s: %s not stored", job.id, rel, why)

    def _store(self, job: Job, points: list[_Point]) -> tuple[int, list[_Point]]:
        """Through the group commit while the attempt's credential lives; once it has ended
        (the last events, read after the end), by the same ingest in a transaction of its
        own. Returns the points stored and those not stored (the writer refused them: its
        queue full, an error), which the next tick tries again."""
        if not points:
            return 0, []
        stored = 0
        attempt = max(1, job.attempts)
        for start in range(0, len(points), REPORT_POINTS):
            part = points[start : start + REPORT_POINTS]
            columns = check_columns(
                Columns(
                    [p[0] for p in part],
                    [p[1] for p in part],
                    [p[2] for p in part],
                    [None] * len(part),
                    [p[3] for p in part],
                    attempt,
                ),
                "events",
            )
            report = Report(uuid.uuid4().hex, attempt, columns)
            try:
                try:
                    if job.token_hash is None:
                        raise Refused(job)
                    done = self.reports.submit(job.id, report, job.token_hash).result()
                    stored += done.accepted
                except Refused:  # the attempt ended: its credential is gone
                    stored += self.store.metrics.add(job.id, columns, batch_id=report.batch_id)
            except Exception as exc:  # the queue full, an error: these and the rest next tick
                log.info("TensorBoard import: job %s's points not stored yet: %s", job.id, exc)
                return stored, points[start:]
            if self.on_stored is not None and job.search_id is not None:
                try:
                    self.on_stored(job, columns)
                except Exception:
                    log.exception("TensorBoard import: job %s's values to its search", job.id)
        return stored, []


_NOT_SCALAR = object()


def _event_files(d: jobfiles.Dir, prefix: str, depth: int, budget: list[int]) -> list[str]:
    """The event files below ``d`` (paths relative to the top), regular files with one link;
    links, FIFOs and the rest are passed over, as are entries past ``budget`` and levels past
    ``depth``."""
    out: list[str] = []
    for name, st in d.entries(limit=max(1, budget[0])):
        budget[0] -= 1
        if budget[0] <= 0:
            break
        if stat.S_ISDIR(st.st_mode) and depth > 0:
            try:
                with d.sub(name) as child:
                    out += _event_files(child, f"{prefix}{name}/", depth - 1, budget)
            except OSError:
                continue
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and "tfevents" in name:
            out.append(prefix + name)
    return out


def _scalar(value: Any) -> object:
    """A summary value's scalar (None: not finite), or ``_NOT_SCALAR``."""
    from tensorboard.util import tensor_util

    if value.HasField("simple_value"):
        number = float(value.simple_value)
    elif value.metadata.plugin_data.plugin_name == "scalars" and value.HasField("tensor"):
        # the shape first: make_ndarray repeats a single value to fill any shape it names,
        # so a 100-byte record of shape [2**40] would ask for terabytes
        if any(dim.size != 1 for dim in value.tensor.tensor_shape.dim):
            return _NOT_SCALAR
        array = tensor_util.make_ndarray(value.tensor)
        if array.size != 1:
            return _NOT_SCALAR
        try:
            number = float(array.reshape(()).item())
        except (TypeError, ValueError):
            return _NOT_SCALAR
    else:
        return _NOT_SCALAR
    return number if math.isfinite(number) else None
