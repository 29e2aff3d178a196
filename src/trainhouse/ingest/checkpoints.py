"""The server's side of checkpoints: where each job's live, registering them, retention.

Checkpoints live in ``HOME/jobs/<id>/checkpoints`` by default, or under ``--checkpoint-url`` (a
shared directory or any fsspec URL) as ``<url>/<id>``; the SDK writes them through
:mod:`trainhouse.jobfs.storage` and the server reads, verifies and deletes them through it too. What
a job leaves there is hostile input: a local storage is opened from a trusted anchor (the server's
home, or the ``--checkpoint-url`` directory) through :mod:`trainhouse.jobfs.jobfiles`, so no link is
followed, only regular files are read or downloaded, a sidecar is read only up to ``MAX_RECORD``
bytes, and retention never deletes through a link.

Retention (the spec's ``checkpoints: {keep_last, keep_best, metric, mode}``) runs on a background
thread after a registration (at most once every :data:`RETENTION_EVERY` seconds per job: faster
checkpoints are dropped in batches; at once when an attempt ends), and never deletes a
checkpoint a restart may need: before anything is deleted, the newest checkpoint that is kept
(the one a restart loads) is read back and its digest (sha256 or blake3, as registered)
checked. If it fails, it is marked corrupt and nothing is deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.errors import CheckpointError, NotFound, ServerBusy
from trainhouse.core.spec import CheckpointPolicy
from trainhouse.jobfs.jobfiles import MAX_RECORD
from trainhouse.jobfs.layout import JobLayout
from trainhouse.jobfs.storage import (
    DIGESTS,
    Storage,
    confine,
    is_temp,
    new_hash,
    open_storage,
    sidecar_name,
)
from trainhouse.store import Checkpoint, Job, Store
from trainhouse.store.tables import storable

log = logging.getLogger(__name__)

CHUNK = 1 << 20
#: records read at an attempt's end, looking for checkpoints it left unregistered
MAX_UNLISTED = 1000
#: seconds between two runs of one job's retention at least: a job that checkpoints faster
#: has what its policy drops deleted in batches, one read-back of the checkpoint a restart
#: would load per batch (a checkpoint every 110 ms cost the server 12 ms of CPU each, on the
#: two cores its ranks ran on); one that checkpoints less often, at once
RETENTION_EVERY = 2.0
#: local storages :meth:`Checkpoints.storage` keeps (all forgotten at once past it)
KEPT_STORAGES = 4096


def retained(checkpoints: list[Checkpoint], policy: CheckpointPolicy) -> set[int]:
    """Ids to keep: the newest ``keep_last`` plus the best ``keep_best`` by the metric."""
    newest = sorted(checkpoints, key=lambda c: (c.step, c.id), reverse=True)
    keep = {c.id for c in newest[: policy.keep_last]}
    if policy.keep_best and policy.metric:
        scored: list[tuple[float, int]] = []
        for c in checkpoints:
            value = c.metrics.get(policy.metric)
            if value is not None and math.isfinite(value):
                scored.append((value if policy.mode == "min" else -value, c.id))
        keep.update(ckpt_id for _, ckpt_id in sorted(scored)[: policy.keep_best])
    return keep


class Checkpoints(BackgroundLoop):
    """Where checkpoints live, their registration, and retention as a background service
    (woken by each registration; work queued before a stop is finished)."""

    name = "trainhouse-checkpoint-gc"
    join_timeout = 60.0
    final_tick = True

    def __init__(self, store: Store, home: Path, base: str | None = None) -> None:
        super().__init__(None)  # ticks when woken
        self.store = store
        self.home = home
        self.base = base.rstrip("/") if base else None
        self._verified: set[int] = set()
        self._storages: dict[int, Storage] = {}  # job -> its local storage (see storage)
        self._changed = threading.Condition()  # guards the three below
        self._due: dict[int, float] = {}  # job -> when (monotonic) its retention runs
        self._collected: dict[int, float] = {}  # job -> when its retention last ran
        self._collecting = False

    # -- where -----------------------------------------------------------------------------
    def location(self, job_id: int) -> str:
        if self.base is None:
            return str(JobLayout(self.home, job_id).checkpoints)
        return f"{self.base}/{job_id}"

    def storage(self, job_id: int) -> Storage:
        """The job's checkpoints; a local one anchored where the job cannot reach: the
        server's home, or the ``--checkpoint-url`` directory (links below it are refused).
        A local one is kept (:data:`KEPT_STORAGES` at most): it holds paths only, every use
        walks from its anchor anew, and making one cost a registration a tenth of its storage
        checks."""
        found = self._storages.get(job_id)
        if found is None:
            found = self._open_storage(job_id)
            if self.local:
                if len(self._storages) >= KEPT_STORAGES:
                    self._storages.clear()
                self._storages[job_id] = found
        return found

    def _open_storage(self, job_id: int) -> Storage:
        if self.base is None:
            return open_storage(self.location(job_id), anchor=self.home)
        if "://" in self.base and not self.base.lower().startswith("file://"):
            return open_storage(self.location(job_id))  # fsspec: no local links to refuse
        return open_storage(self.location(job_id), anchor=open_storage(self.base).local_root)

    # -- registering -----------------------------------------------------------------------
    def register(
        self,
        job: Job,
        *,
        attempt: int,
        step: int,
        path: str,
        size: int,
        sha256: str,
        metrics: dict[str, float | None],
        kind: str,
        algorithm: str = "sha256",
    ) -> Checkpoint:
        """Check a checkpoint the SDK of ``job`` finished writing against what is in storage
        (:meth:`record`), record it, and queue the job's retention."""
        ckpt = self.record(
            job,
            attempt=attempt,
            step=step,
            path=path,
            size=size,
            sha256=sha256,
            metrics=metrics,
            kind=kind,
            algorithm=algorithm,
        )
        self.collect_later(job.id)
        return ckpt

    @property
    def local(self) -> bool:
        """Whether the checkpoints are on a local file system (checked in microseconds: what
        :meth:`record` reads may be read in the group commit writer's transaction)."""
        return (
            self.base is None or "://" not in self.base or self.base.lower().startswith("file://")
        )

    def record(
        self,
        job: Job,
        *,
        attempt: int,
        step: int,
        path: str,
        size: int,
        sha256: str,
        metrics: dict[str, float | None],
        kind: str,
        algorithm: str = "sha256",
    ) -> Checkpoint:
        """:meth:`register` without the retention (the caller queues it once the record is
        committed: :meth:`collect_later`): the checkpoint is found in storage as reported (a
        CheckpointError if not) and recorded, in the caller's transaction if one is open."""
        storage = self.storage(job.id)
        name = confine(path)  # one spelling per checkpoint; refuses names that escape
        try:
            found = storage.entry(name)  # a link, a FIFO, ... is refused here
        except OSError as exc:
            raise CheckpointError(f"checkpoint {path!r} cannot be read: {exc}") from None
        if found is None:
            raise CheckpointError(f"checkpoint {path!r} does not exist in {storage.url}")
        is_dir, actual = found
        if (kind == "sharded") != is_dir:
            what = "a directory" if is_dir else "a file"
            raise CheckpointError(f"checkpoint {path!r} is {what}, but was reported as {kind}")
        if actual != size:
            raise CheckpointError(
                f"checkpoint {path!r} is {actual} bytes in storage, but {size} were reported"
            )
        return self.store.checkpoints.add(
            job.id,
            attempt=attempt,
            step=step,
            path=name,
            size=size,
            sha256=sha256,
            metrics=metrics,
            kind=kind,
            algorithm=algorithm,
            # the same checkpoint written again (a step redone after a restart) replaces it
            replace=True,
        )

    def register_unlisted(self, job_id: int, attempt: int) -> list[Checkpoint]:
        """Checkpoints an attempt wrote but could not register (the server was down as it
        ended): found by the record the SDK keeps next to each one, checked, registered.
        At most :data:`MAX_UNLISTED` records are read, each of at most ``MAX_RECORD`` bytes."""
        storage = self.storage(job_id)
        known = {c.path for c in self.store.checkpoints.list(job_id, include_deleted=True)}
        added = []
        try:
            names = storage.list()
        except (OSError, CheckpointError):
            return []
        unlisted = [
            name
            for name in names
            if name.endswith(".json")
            and name.removesuffix(".json") not in known
            and not is_temp(name)
            # (a name the file system gave undecoded, a lone surrogate, cannot be stored)
            and storable(name) == name
        ]
        if len(unlisted) > MAX_UNLISTED:
            log.error(
                "job %s: %d checkpoint records left unregistered; only the first %d are read",
                job_id,
                len(unlisted),
                MAX_UNLISTED,
            )
        for name in unlisted[:MAX_UNLISTED]:
            path = name.removesuffix(".json")
            try:
                record = json.loads(storage.read_text(name, max_size=MAX_RECORD))
                step, size = int(record["step"]), int(record["size"])
                kind = "sharded" if record.get("kind") == "sharded" else "file"
                algorithm = str(record.get("algorithm") or "sha256")
                if (
                    record["path"] != path
                    or not storage.exists(path)
                    or storage.is_dir(path) != (kind == "sharded")
                    or storage.size(path) != size
                    or not re.fullmatch(r"[0-9a-f]{64}", str(record["sha256"]))
                    or algorithm not in DIGESTS
                ):
                    continue
                metrics = {
                    str(k): (float(v) if v is not None else None)
                    for k, v in dict(record.get("metrics") or {}).items()
                }
            except (
                OSError,
                CheckpointError,
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
                RecursionError,  # JSON nested deeper than the parser goes
            ):
                continue
            added.append(
                self.store.checkpoints.add(
                    job_id,
                    attempt=int(record.get("attempt") or attempt),
                    step=step,
                    path=path,
                    size=size,
                    sha256=str(record["sha256"]),
                    metrics=metrics,
                    kind=kind,
                    algorithm=algorithm,
                )
            )
        if added:
            log.info("job %s: registered %d checkpoints left unregistered", job_id, len(added))
            self.collect_later(job_id)
        return added

    def mark_corrupt(self, job: Job, checkpoint_id: int, reason: str) -> Checkpoint:
        ckpt = self.store.checkpoints.get(job.id, checkpoint_id)
        self.store.checkpoints.mark_corrupt(ckpt.id, reason[:2000])
        self.store.jobs.add_event(job.id, f"checkpoint of step {ckpt.step} is corrupt: {reason}")
        log.error(
            "job %s: checkpoint %s (step %s) is corrupt: %s", job.id, ckpt.path, ckpt.step, reason
        )
        return self.store.checkpoints.get(job.id, checkpoint_id)

    # -- retention -------------------------------------------------------------------------
    def collect(self, job_id: int) -> list[Checkpoint]:
        """Delete what the job's policy does not keep; returns what was deleted."""
        job = self.store.jobs.get(job_id)
        policy = job.spec.checkpoints
        live = [c for c in self.store.checkpoints.list(job_id) if c.corrupt is None]
        keep = retained(live, policy)
        drop = [c for c in live if c.id not in keep]
        if not drop:
            return []
        storage = self.storage(job_id)
        newest = max((c for c in live if c.id in keep), key=lambda c: (c.step, c.id))
        if newest.id not in self._verified:
            try:  # never more than the registered size: a file grown sparse is not hashed
                actual = storage.digest(
                    newest.path, max_bytes=newest.size, algorithm=newest.algorithm
                )
            except (OSError, CheckpointError) as exc:
                actual = f"unreadable ({exc})"
            if actual != newest.sha256:
                self.mark_corrupt(
                    job,
                    newest.id,
                    f"{newest.algorithm} {actual[:16]} does not match the registered "
                    f"{newest.sha256[:16]}; "
                    "older checkpoints are kept",
                )
                return []
            self._verified.add(newest.id)
        names = [name for old in drop for name in (old.path, sidecar_name(old.path))]
        # a link on the way: nothing was deleted through it
        for name, why in storage.delete_many(names):
            log.warning("job %s: checkpoint %s not deleted: %s", job_id, name, why)
        self.store.checkpoints.mark_deleted([c.id for c in drop])
        return drop

    def collect_later(self, job_id: int, *, now: bool = False) -> None:
        """Queue the retention of ``job_id``: at once if it ran more than
        :data:`RETENTION_EVERY` seconds ago (or ``now``), else that long after it ran."""
        with self._changed:
            at = time.monotonic()
            if not now:
                at = max(at, self._collected.get(job_id, -math.inf) + RETENTION_EVERY)
            self._due[job_id] = min(self._due.get(job_id, math.inf), at)
        self.wake()

    def attempt_ended(self, job_id: int, attempt: int) -> None:
        """An attempt of ``job_id`` ended: what it left unregistered is registered, and its
        retention runs now (not up to :data:`RETENTION_EVERY` later)."""
        self.register_unlisted(job_id, attempt)
        self.collect_later(job_id, now=True)

    def drain(self) -> None:
        """Run every queued retention now, and wait until it ran (tests)."""
        with self._changed:
            self._due = dict.fromkeys(self._due, -math.inf)
        self.wake()
        with self._changed:
            self._changed.wait_for(lambda: not self._due and not self._collecting)

    def next_wait(self, elapsed: float) -> float | None:
        with self._changed:
            due = min(self._due.values(), default=None)
        return None if due is None else max(0.0, due - time.monotonic())

    def tick(self) -> None:
        """Apply the retention of every job whose turn has come (all of them once stopping)."""
        with self._changed:
            now = time.monotonic()
            stopping = self._stopping.is_set()
            ready = [j for j, at in self._due.items() if stopping or at <= now]
            for job_id in ready:
                del self._due[job_id]
                self._collected[job_id] = now
            self._collecting = bool(ready)
            for job_id, at in list(self._collected.items()):  # only the recent ones matter
                if at < now - RETENTION_EVERY and job_id not in self._due:
                    del self._collected[job_id]
        try:
            for job_id in ready:
                try:
                    self.collect(job_id)
                except Exception:  # keep collecting for other jobs; the error is in the log
                    log.exception("job %s: checkpoint retention failed", job_id)
        finally:
            with self._changed:
                self._collecting = False
                self._changed.notify_all()

    # -- copies (clone --from-checkpoint) ---------------------------------------------------
    def check_copy(self, ckpt: Checkpoint, near: int, *, max_bytes: int) -> None:
        """Refuse, before any byte is read, a copy of ``ckpt`` larger than ``max_bytes`` (its
        registered size: what a copy reads at most, a sparse file's apparent size) or than
        the space left where job ``near``'s checkpoints are (the copy's storage is beside)."""
        if ckpt.size > max_bytes:
            raise CheckpointError(
                f"checkpoint of step {ckpt.step} is {ckpt.size} bytes, more than the "
                f"{max_bytes} a copy may take (the server's --clone-max-bytes); not copied"
            )
        try:
            free = self.storage(near).free_bytes()
        except OSError:
            free = None
        if free is not None and ckpt.size > free:
            raise CheckpointError(
                f"checkpoint of step {ckpt.step} is {ckpt.size} bytes; its copy's storage has "
                f"{free} bytes free; not copied"
            )

    def copy(
        self, source: Job, ckpt: Checkpoint, target: Job, cancel: threading.Event | None = None
    ) -> None:
        """Copy ``ckpt`` of ``source`` into ``target``'s storage under the same name, verified
        as a restart verifies it: a file's digest (its registered algorithm) is computed over
        the bytes as they are copied, never more than its registered size; a sharded
        checkpoint's tree digest is computed over the copy. Written under a temp name and
        published only once it matches; then its record (next to it, for the SDK). A mismatch
        raises CheckpointError and leaves nothing behind, as ``cancel`` set does (ServerBusy).
        :meth:`add_copy` registers it."""
        src, dst = self.storage(source.id), self.storage(target.id)
        name = confine(ckpt.path)
        listing = self.files(source.id, ckpt)  # NotFound / CheckpointError when it is gone
        tmp = dst.temp_name(name)
        try:
            if ckpt.kind == "sharded":
                budget = ckpt.size
                for sub, size in listing:
                    budget -= size
                    if budget < 0:
                        raise CheckpointError(
                            f"checkpoint of step {ckpt.step} holds more than its registered "
                            f"{ckpt.size} bytes"
                        )
                    _copy_file(
                        src,
                        f"{name}/{confine(sub)}",
                        dst,
                        f"{tmp}/{confine(sub)}",
                        size,
                        cancel=cancel,
                    )
                actual = dst.digest(tmp, max_bytes=ckpt.size)
            else:
                actual = _copy_file(
                    src, name, dst, tmp, ckpt.size, algorithm=ckpt.algorithm, cancel=cancel
                )
            if actual != ckpt.sha256:
                raise CheckpointError(
                    f"checkpoint of step {ckpt.step} of job {source.id} is corrupt: its "
                    f"{ckpt.algorithm} is {actual[:16]}, the registered one {ckpt.sha256[:16]}; "
                    "not copied"
                )
            dst.publish(tmp, name)
        except BaseException:
            with contextlib.suppress(Exception):
                dst.delete(tmp)
            raise
        record = {
            "step": ckpt.step,
            "path": name,
            "size": ckpt.size,
            "sha256": ckpt.sha256,
            "algorithm": ckpt.algorithm,
            "kind": ckpt.kind,
            "metrics": ckpt.metrics,
            "attempt": 0,
            "copied_from": {"job": source.id, "step": ckpt.step},
        }
        dst.write_text(sidecar_name(name), json.dumps(record))

    def add_copy(self, ckpt: Checkpoint, target: Job) -> Checkpoint:
        """Register the copy :meth:`copy` made as ``target``'s checkpoint of attempt 0, the
        one its first attempt loads."""
        name = confine(ckpt.path)
        return self.store.checkpoints.add(
            target.id,
            attempt=0,
            step=ckpt.step,
            path=name,
            size=ckpt.size,
            sha256=ckpt.sha256,
            metrics=ckpt.metrics,
            kind=ckpt.kind,
            algorithm=ckpt.algorithm,
        )

    def copy_file(
        self, job: Job, ckpt: Checkpoint, to: str, cancel: threading.Event | None = None
    ) -> str:
        """Copy the file checkpoint ``ckpt`` of ``job`` to ``to`` in the same storage (a
        model registered from it), verified as :meth:`copy` verifies: its registered digest
        over the bytes copied, never more than its registered size; a CheckpointError on a
        mismatch (the partial copy is the caller's to remove), ServerBusy once ``cancel`` is
        set. Returns the copy's sha256."""
        if ckpt.kind != "file":
            raise CheckpointError(
                f"checkpoint of step {ckpt.step} is {ckpt.kind}, not one file: it cannot be copied "
                "as a model"
            )
        storage = self.storage(job.id)
        self.files(job.id, ckpt)  # NotFound / CheckpointError when it is gone or changed
        sha256 = new_hash("sha256")
        try:
            actual = _copy_file(
                storage,
                confine(ckpt.path),
                storage,
                confine(to),
                ckpt.size,
                algorithm=ckpt.algorithm,
                also=sha256,
                cancel=cancel,
            )
        except OSError as exc:
            raise CheckpointError(f"checkpoint of step {ckpt.step} cannot be read: {exc}") from None
        if actual != ckpt.sha256:
            raise CheckpointError(
                f"checkpoint of step {ckpt.step} of job {job.id} is corrupt: its "
                f"{ckpt.algorithm} is {actual[:16]}, the registered one {ckpt.sha256[:16]}; "
                "not copied"
            )
        return str(sha256.hexdigest())

    def remove_all(self, job_id: int) -> None:
        """Delete every checkpoint file of ``job_id`` (a clone that never ran, discarded)."""
        storage = self.storage(job_id)
        with contextlib.suppress(OSError, CheckpointError):
            for name in storage.list():
                storage.delete(name)

    # -- downloads -------------------------------------------------------------------------
    def files(self, job_id: int, ckpt: Checkpoint) -> list[tuple[str, int]]:
        """A checkpoint's files as (name, size); a file checkpoint is one file named ``""``.
        A CheckpointError when it holds anything but regular files and directories."""
        storage = self.storage(job_id)
        try:
            if not storage.exists(ckpt.path):
                raise NotFound(f"checkpoint of step {ckpt.step} is no longer in {storage.url}")
            if storage.is_dir(ckpt.path) != (ckpt.kind == "sharded"):
                what = "a directory" if ckpt.kind == "file" else "not a directory"
                raise CheckpointError(
                    f"checkpoint of step {ckpt.step} was registered as {ckpt.kind}, but "
                    f"{ckpt.path} is now {what}"
                )
            if ckpt.kind == "sharded":
                return storage.files(ckpt.path)
            return [("", storage.size(ckpt.path))]
        except OSError as exc:
            raise CheckpointError(f"checkpoint of step {ckpt.step} cannot be read: {exc}") from None

    def read(self, job_id: int, ckpt: Checkpoint, name: str) -> Iterator[bytes]:
        """The bytes of a checkpoint's file, in chunks; only a regular file is opened, and
        the open never waits (a FIFO is refused, not read)."""
        storage = self.storage(job_id)
        rel = ckpt.path if not name else f"{ckpt.path}/{confine(name)}"
        try:
            if (ckpt.kind == "sharded") == (not name) or not storage.exists(rel):
                raise NotFound(f"checkpoint of step {ckpt.step} has no file {name!r}")
            fh = storage.open_read(rel)
        except OSError as exc:
            raise CheckpointError(f"checkpoint of step {ckpt.step} cannot be read: {exc}") from None

        def chunks() -> Iterator[bytes]:
            with fh:
                while data := fh.read(CHUNK):
                    yield data

        return chunks()


def hash_file(
    storage: Storage, rel: str, size: int, *, cancel: threading.Event | None = None
) -> str:
    """The sha256 of the file ``rel`` of ``storage``, which must hold exactly ``size`` bytes
    (no more is read: a CheckpointError past them or short of them); ServerBusy once
    ``cancel`` is set."""
    return _copy_file(storage, rel, None, "", size, cancel=cancel)


def _copy_file(
    src: Storage,
    rel: str,
    dst: Storage | None,
    to: str,
    size: int,
    *,
    algorithm: str = "sha256",
    also: Any = None,
    cancel: threading.Event | None = None,
) -> str:
    """Copy the file ``rel`` of ``src`` to ``to`` in ``dst`` (None: only read it), reading at
    most ``size`` bytes (a CheckpointError past them); returns the ``algorithm`` digest of what
    was copied (and feeds the same bytes to the hasher ``also``). ServerBusy once ``cancel``
    is set (the server stops)."""
    hasher = new_hash(algorithm)
    left = size
    with src.open_read(rel) as fh, dst.open_write(to) if dst else contextlib.nullcontext() as out:
        while chunk := fh.read(min(CHUNK, left + 1)):
            if cancel is not None and cancel.is_set():
                raise ServerBusy(f"the server is stopping: {rel} was not read to its end")
            left -= len(chunk)
            if left < 0:
                raise CheckpointError(f"{rel} holds more than its registered {size} bytes")
            hasher.update(chunk)
            if also is not None:
                also.update(chunk)
            if out is not None:
                out.write(chunk)
    if left:
        raise CheckpointError(f"{rel} holds {size - left} bytes, not its registered {size}")
    return str(hasher.hexdigest())
