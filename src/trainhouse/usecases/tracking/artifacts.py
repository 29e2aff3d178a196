"""A run's artifacts: upload one, download one, list a directory of them.

The files live in the job's directory, ``HOME/jobs/<id>/artifacts/``
(:attr:`~trainhouse.jobfs.layout.JobLayout.artifacts`), which a launched job's processes could
reach: every path is walked from the server's home without following a link
(:mod:`trainhouse.jobfs.jobfiles`), a write goes to a fresh file renamed into place, a read
opens only a regular file with one link, and sizes are capped (``Settings.mlflow_artifact_bytes``
a file, ``mlflow_run_artifact_bytes`` a run). A path arrives as its checked components (a plain
name each: the MLflow API refuses ``..``, ``.``, NUL and backslashes, and the names of uploads
under way).
"""

from __future__ import annotations

import contextlib
import errno
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from trainhouse.core.errors import ArtifactTooLarge, InvalidTracking, NotFound
from trainhouse.core.records import Job
from trainhouse.jobfs import jobfiles
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.tracking.callers import Caller, run_job

__all__ = [
    "CHUNK",
    "MAX_DEPTH",
    "MAX_LISTED",
    "ArtifactEntry",
    "Upload",
    "download",
    "listing",
    "upload",
]

MAX_DEPTH = 32  # directories below a run's root
MAX_LISTED = 10_000  # entries of a run's artifacts
CHUNK = 1 << 20


@dataclass(frozen=True)
class ArtifactEntry:
    """One entry of a listing: a name relative to the directory listed, and a file's size."""

    path: str
    is_dir: bool
    file_size: int | None = None


def _open_root(rt: Runtime, job: Job, *, make: bool) -> jobfiles.Dir:
    """The run's artifacts directory, walked from the home (made when ``make``)."""
    home = rt.settings.home
    files = rt.files(job.id)
    if not make:
        return jobfiles.open_dir(home, files.artifacts)
    (home / "jobs").mkdir(parents=True, exist_ok=True)
    d = jobfiles.open_dir(home, home / "jobs")
    for name in (str(job.id), "artifacts"):
        try:
            child = d.make_sub(name)
        finally:
            d.close()
        d = child
    return d


def _walk_to(root: jobfiles.Dir, parts: list[str], *, make: bool) -> jobfiles.Dir:
    d = root
    for name in parts:
        try:
            child = d.make_sub(name) if make else d.sub(name)
        finally:
            if d is not root:
                d.close()
        d = child
    return d


def _used(d: jobfiles.Dir, budget: list[int] | None = None, depth: int = MAX_DEPTH) -> int:
    """The bytes of the regular files below ``d`` (links, FIFOs and the rest are no artifacts
    and count nothing); past :data:`MAX_LISTED` entries the run is refused more."""
    budget = [MAX_LISTED] if budget is None else budget
    total = 0
    for name, st in d.entries(limit=MAX_LISTED):
        budget[0] -= 1
        if budget[0] < 0:
            raise InvalidTracking(f"a run holds at most {MAX_LISTED} artifact entries")
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode) and depth > 0:
            try:
                with d.sub(name) as child:
                    total += _used(child, budget, depth - 1)
            except OSError:
                continue
    return total


#: why an artifact is refused, by errno: the words only, never the file's path on the server
_REFUSED = {
    errno.ELOOP: "it is a symbolic link (links are not followed)",
    errno.EMLINK: "it has several hard links",
    errno.EFBIG: "it is over the size limit",
    errno.E2BIG: "the run holds too many artifact entries",
    errno.EISDIR: "it is a directory",
}


def _unsafe(exc: OSError, parts: list[str]) -> NotFound | InvalidTracking:
    """What a refused file operation answers: a missing artifact, or one refused, named by its
    path among the run's artifacts (the server's own paths are no caller's business)."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return NotFound("no such artifact")
    why = _REFUSED.get(exc.errno or 0, "it is not a regular file")
    return InvalidTracking(f"artifact {'/'.join(parts)[:300] or '.'} refused: {why}")


class Upload:
    """One artifact being written: :meth:`write` its bytes (at most the limit), then
    :meth:`finish` (renamed into place); :meth:`close` in any case (an unfinished upload's
    file is removed)."""

    def __init__(
        self,
        root: jobfiles.Dir,
        d: jobfiles.Dir,
        tmp: str,
        fh: BinaryIO,
        parts: list[str],
        *,
        limit: int,
    ) -> None:
        self._root, self._dir, self._tmp, self._fh, self._parts = root, d, tmp, fh, parts
        self._limit = limit
        self._written = 0
        self._done = False

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``; :class:`ArtifactTooLarge` once the artifact is over the limit."""
        self._written += len(chunk)
        if self._written > self._limit:
            raise ArtifactTooLarge(f"an artifact is at most {self._limit} bytes")
        if chunk:
            self._fh.write(chunk)

    def finish(self) -> None:
        """Put the artifact in place, replacing one of its path."""
        self._fh.close()
        try:
            self._dir.rename(self._tmp, self._parts[-1])
        except IsADirectoryError:
            raise InvalidTracking(f"{'/'.join(self._parts)} is a directory of artifacts") from None
        self._done = True

    def close(self) -> None:
        """Close the file and the directories; an unfinished upload's file is removed."""
        self._fh.close()
        if not self._done:
            with contextlib.suppress(OSError):
                self._dir.unlink(self._tmp)
        if self._dir is not self._root:
            self._dir.close()
        self._root.close()


def upload(rt: Runtime, c: Caller, run: int, parts: list[str], declared: int | None) -> Upload:
    """Begin storing artifact ``parts`` of run ``run`` (one ``c`` may write), ``declared``
    bytes long if the request says (refused at once past the artifact's or the run's limit)."""
    job = run_job(rt, c, run, write=True)
    limit = rt.settings.mlflow_artifact_bytes
    if declared is not None and declared > limit:
        raise ArtifactTooLarge(f"an artifact is at most {limit} bytes")
    try:
        root = _open_root(rt, job, make=True)
        try:
            used = _used(root)
            if used + (declared or 0) > rt.settings.mlflow_run_artifact_bytes:
                raise ArtifactTooLarge(
                    f"run {run}'s artifacts would pass {rt.settings.mlflow_run_artifact_bytes} "
                    f"bytes ({used} stored)"
                )
            d = _walk_to(root, parts[:-1], make=True)
            tmp, fh = d.create_temp(parts[-1])
        except BaseException:
            root.close()
            raise
    except OSError as exc:
        raise _unsafe(exc, parts) from None
    return Upload(root, d, tmp, fh, parts, limit=limit)


def download(rt: Runtime, c: Caller, run: int, parts: list[str]) -> Iterator[bytes]:
    """The bytes of artifact ``parts`` of run ``run`` (one ``c`` may read), in chunks; the
    file is opened (or refused) before the first."""
    job = run_job(rt, c, run, write=False)
    try:
        root = _open_root(rt, job, make=False)
        try:
            d = _walk_to(root, parts[:-1], make=False)
            try:
                fh = d.open_file(parts[-1], max_size=rt.settings.mlflow_artifact_bytes)
            finally:
                if d is not root:
                    d.close()
        finally:
            root.close()
    except OSError as exc:
        raise _unsafe(exc, parts) from None

    def chunks() -> Iterator[bytes]:
        with fh:
            while data := fh.read(CHUNK):
                yield data

    return chunks()


def _entries(rt: Runtime, job: Job, parts: list[str]) -> list[ArtifactEntry]:
    try:
        root = _open_root(rt, job, make=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        try:
            d = _walk_to(root, parts, make=False)
        except NotADirectoryError:  # a file: itself
            d = _walk_to(root, parts[:-1], make=False)
            try:
                st = d.lstat(parts[-1])
            finally:
                if d is not root:
                    d.close()
            if st is None or not stat.S_ISREG(st.st_mode):
                return []
            return [ArtifactEntry(parts[-1], False, st.st_size)]
        except FileNotFoundError:
            return []
        try:
            found = d.entries(limit=MAX_LISTED)
        finally:
            if d is not root:
                d.close()
    finally:
        root.close()
    out: list[ArtifactEntry] = []
    for name, st in found:
        if name.startswith(".") and ".tmp-" in name:
            continue  # an upload under way
        if stat.S_ISDIR(st.st_mode):
            out.append(ArtifactEntry(name, True))
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            out.append(ArtifactEntry(name, False, st.st_size))
    return out


def listing(rt: Runtime, c: Caller, run: int, parts: list[str]) -> list[ArtifactEntry]:
    """The entries of directory ``parts`` of run ``run``'s artifacts (one ``c`` may read); a
    file's path lists the file itself; a missing one lists nothing."""
    job = run_job(rt, c, run, write=False)
    try:
        return _entries(rt, job, parts)
    except OSError as exc:
        raise _unsafe(exc, parts) from None
