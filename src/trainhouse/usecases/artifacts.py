"""A job's artifacts for whoever may read the job: the listing, one file's bytes to download,
one small file to view inline.

The files are those MLflow's artifact API and ``run.log_artifact`` store
(:mod:`trainhouse.usecases.tracking.artifacts` writes them), in the job's directory, which the
job's processes can reach: every read goes through :mod:`trainhouse.jobfs.artifacts` (no link
followed, regular files with one link only, FIFOs and devices never opened, bounded walks). The
job arrives already checked readable (``server/auth.py``'s ``readable_job``: the same rules as
the job's logs and checkpoints). What a file is shown as comes from its bytes: a raster image
(PNG, JPEG, GIF, WebP) by its signature, text when it is UTF-8 without NUL, and only up to
:data:`MAX_INLINE` bytes; everything else is a download.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass

from trainhouse.core.errors import ArtifactTooLarge, InvalidTracking, NotFound
from trainhouse.core.records import Job
from trainhouse.jobfs import artifacts as files
from trainhouse.usecases.runtime import Runtime

__all__ = ["CHUNK", "MAX_INLINE", "Artifact", "Opened", "listing", "open_artifact", "parts"]

CHUNK = 1 << 20
#: bytes of a file shown inline on the job page (text or image); larger ones are downloads
MAX_INLINE = 2 << 20


@dataclass(frozen=True)
class Artifact:
    """One artifact as the API lists it."""

    path: str
    size: int
    mtime: float
    kind: str  # what its name suggests: text, table, image or file


@dataclass(frozen=True)
class Opened:
    """An artifact open to send: its file name, size, content type (for an inline view: the
    sniffed image type or ``text/plain``), and its bytes in chunks."""

    name: str
    size: int
    content_type: str
    chunks: Iterator[bytes]


def parts(path: str) -> list[str]:
    """An artifact path's checked components (InvalidTracking naming the rule it breaks)."""
    try:
        return files.parts_of(path)
    except ValueError as exc:
        raise InvalidTracking(f"invalid artifact path {path[:200]!r}: {exc}") from None


def listing(rt: Runtime, job: Job) -> tuple[list[Artifact], int, bool]:
    """The job's artifacts (sorted by path), how many entries were left out as no plain file
    (links, FIFOs, devices, sockets, hard-linked files), and whether the walk hit its bound."""
    layout = rt.files(job.id)
    try:
        found = files.listing(rt.settings.home, layout.artifacts)
    except OSError:  # a directory on the way is a link
        raise InvalidTracking(
            f"job {job.id}'s artifacts directory is not a plain directory; nothing is listed"
        ) from None
    out = [Artifact(f.path, f.size, f.mtime, files.kind_of_name(f.path)) for f in found.files]
    return out, found.skipped, found.truncated


def _refused(exc: OSError, path: str) -> NotFound | InvalidTracking:
    """What a refused open answers (never the server's own paths)."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return NotFound(f"the job has no artifact {path[:300]!r}")
    why = {
        errno.ELOOP: "a symbolic link (links are not followed)",
        errno.EMLINK: "a file with several hard links",
        errno.EISDIR: "a directory",
    }.get(exc.errno or 0, "not a regular file")
    return InvalidTracking(f"artifact {path[:300]!r} is refused: it is {why}")


def open_artifact(rt: Runtime, job: Job, path: str, *, inline: bool = False) -> Opened:
    """Artifact ``path`` of ``job`` open to send. A download (``inline`` false) is any plain
    file, as ``application/octet-stream``; an inline view is a raster image or UTF-8 text of at
    most :data:`MAX_INLINE` bytes (ArtifactTooLarge past it, InvalidTracking for anything
    else, each saying to download it instead)."""
    names = parts(path)
    clean = "/".join(names)
    if not names:
        raise InvalidTracking("name an artifact file: the artifacts' root is a directory")
    try:
        fh, size = files.open_artifact(rt.settings.home, rt.files(job.id).artifacts, names)
    except OSError as exc:
        raise _refused(exc, clean) from None
    try:
        content_type = "application/octet-stream"
        head = b""
        if inline:
            if size > MAX_INLINE:
                raise ArtifactTooLarge(
                    f"artifact {clean!r} is {size} bytes: only files up to {MAX_INLINE} bytes "
                    "are shown on the page; download it instead"
                )
            head = fh.read(MAX_INLINE + 1)
            if len(head) > MAX_INLINE:
                raise ArtifactTooLarge(f"artifact {clean!r} grew past {MAX_INLINE} bytes")
            image = files.sniff_image(head)
            if image is not None:
                content_type = image
            elif files.is_text(head):
                content_type = "text/plain; charset=utf-8"
            else:
                raise InvalidTracking(
                    f"artifact {clean!r} is neither text nor a PNG, JPEG, GIF or WebP image: "
                    "download it to look at it"
                )
    except BaseException:
        fh.close()
        raise

    def chunks() -> Iterator[bytes]:
        """The bytes, never more than the size announced (a file the job keeps writing
        meanwhile is cut there; the client's size check sees one that shrank)."""
        with fh:
            if inline:
                yield head
                return
            left = size
            while left > 0 and (data := fh.read(min(CHUNK, left))):
                left -= len(data)
                yield data

    return Opened(names[-1], len(head) if inline else size, content_type, chunks())
