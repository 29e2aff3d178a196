"""A job's artifacts as files: the path rules, the confined listing, one opened, what it is.

The artifacts live in ``HOME/jobs/<id>/artifacts/`` (:attr:`.layout.JobLayout.artifacts`),
which the server writes (MLflow's artifact API, ``run.log_artifact``) but the job's processes
can reach: anything may be there. So:

- a path a caller names is checked first (:func:`parts_of`): relative, plain components, no
  ``..``, ``.``, NUL, backslash or the name of an upload under way, bounded in length and depth;
- the listing (:func:`listing`) walks the tree from the artifacts directory without following a
  link (:mod:`.jobfiles`), keeps regular files with one link and directories, and leaves out
  (counting them) links, FIFOs, sockets, devices, hard-linked files and uploads under way;
  entries and depth are bounded, and a listing cut short says so;
- a file is opened through the same walk (:func:`open_artifact`): never a link, a FIFO, a
  device or a hard-linked file;
- what a file is for the dashboard (:func:`sniff_image`, :func:`is_text`) comes from its bytes,
  never from its name: an image only when its first bytes are PNG, JPEG, GIF or WebP.

Standard library and :mod:`.jobfiles` only.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from trainhouse.jobfs import jobfiles

__all__ = [
    "MAX_DEPTH",
    "MAX_LISTED",
    "MAX_PATH",
    "ArtifactFile",
    "Listing",
    "is_text",
    "is_upload",
    "kind_of_name",
    "listing",
    "open_artifact",
    "parts_of",
    "sniff_image",
]

#: directories below the artifacts root (the MLflow API's own bound)
MAX_DEPTH = 32
#: entries a listing walks at most (files, directories and what is left out together)
MAX_LISTED = 10_000
#: characters of an artifact's path, and of one component
MAX_PATH = 1024
MAX_COMPONENT = 255

_TEXT = {
    ".txt", ".log", ".md", ".json", ".jsonl", ".yaml", ".yml", ".toml", ".ini", ".cfg",
    ".py", ".sh", ".xml", ".html", ".htm", ".svg", ".out", ".err",
}  # fmt: skip
_TABLE = {".csv", ".tsv"}
_IMAGE = {".png", ".jpg", ".jpeg", ".gif", ".webp"}


def is_upload(name: str) -> bool:
    """Whether ``name`` is a file still being written (:meth:`.jobfiles.Dir.create_temp`)."""
    return name.startswith(".") and ".tmp-" in name


def parts_of(path: str) -> list[str]:
    """The components of the artifact path ``path`` (``a/b.txt``), each checked; ValueError
    naming the rule it breaks. An empty path (or ``/``-only) is the root: ``[]``."""
    if len(path) > MAX_PATH:
        raise ValueError(f"an artifact path is at most {MAX_PATH} characters")
    if "\x00" in path:
        raise ValueError("an artifact path has no NUL character")
    if "\\" in path:
        raise ValueError("an artifact path separates directories with '/', not '\\'")
    if path.startswith("/"):
        raise ValueError("an artifact path is relative to the job's artifacts, not absolute")
    parts = [p for p in path.split("/") if p != ""]
    if len(parts) > MAX_DEPTH + 1:
        raise ValueError(f"an artifact path is at most {MAX_DEPTH} directories deep")
    for part in parts:
        if part in (".", ".."):
            raise ValueError(f"an artifact path has no {part!r} component")
        if len(part) > MAX_COMPONENT:
            raise ValueError(f"an artifact path's components are at most {MAX_COMPONENT} long")
        if is_upload(part):
            raise ValueError(f"{part[:60]!r} is an upload under way, not an artifact")
    return parts


def kind_of_name(name: str) -> str:
    """What the dashboard may try to show a file as, by its name: ``text``, ``table``,
    ``image`` or ``file`` (a hint only: what is served inline is decided by the bytes)."""
    suffix = posixpath.splitext(name.lower())[1]
    if suffix in _IMAGE:
        return "image"
    if suffix in _TABLE:
        return "table"
    if suffix in _TEXT:
        return "text"
    return "file"


def sniff_image(head: bytes) -> str | None:
    """The raster image type the first bytes say (``image/png``, ``image/jpeg``,
    ``image/gif``, ``image/webp``), or None: SVG and everything else is no image here."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(head) >= 12 and head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def is_text(data: bytes) -> bool:
    """Whether ``data`` reads as text: UTF-8 without NUL bytes."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass(frozen=True)
class ArtifactFile:
    """One listed file: its path below the artifacts root, its size, when it was written."""

    path: str
    size: int
    mtime: float


@dataclass
class Listing:
    """The files found (sorted by path), how many entries were left out (links, FIFOs,
    sockets, devices, hard-linked files), and whether the walk stopped at a bound."""

    files: list[ArtifactFile] = field(default_factory=list)
    skipped: int = 0
    truncated: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _walk(d: jobfiles.Dir, prefix: str, out: Listing, budget: list[int], depth: int) -> None:
    try:
        found = d.entries(limit=max(budget[0], 1))
    except jobfiles.UnsafeFile:  # more entries than the budget left
        out.truncated = True
        return
    for name, st in found:
        if budget[0] <= 0:
            out.truncated = True
            return
        budget[0] -= 1
        if is_upload(name):
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth <= 0:
                out.truncated = True
                continue
            try:
                child = d.sub(name)
            except OSError:  # replaced by a link or removed since the listing
                out.skipped += 1
                continue
            with child:
                _walk(child, f"{prefix}{name}/", out, budget, depth - 1)
        elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            out.files.append(ArtifactFile(f"{prefix}{name}", st.st_size, st.st_mtime))
        else:  # a link, a FIFO, a socket, a device, a hard-linked file: no artifact
            out.skipped += 1


def listing(
    anchor: Path, root: Path, *, limit: int = MAX_LISTED, depth: int = MAX_DEPTH
) -> Listing:
    """Every artifact file below ``root`` (the job's artifacts directory), walked from
    ``anchor`` (the server's home) without following a link; a missing directory lists
    nothing. UnsafeFile when a directory on the way to ``root`` is a link."""
    out = Listing()
    try:
        d = jobfiles.open_dir(anchor, root)
    except (FileNotFoundError, NotADirectoryError):
        return out
    with d:
        _walk(d, "", out, [limit], depth)
    out.files.sort(key=lambda f: f.path)
    return out


def open_artifact(
    anchor: Path, root: Path, parts: list[str], *, max_size: int | None = None
) -> tuple[BinaryIO, int]:
    """The artifact file ``parts`` below ``root`` open for reading, and its size: walked from
    ``anchor`` without following a link, a regular file with one link only (UnsafeFile
    otherwise, ``EFBIG`` past ``max_size``); FileNotFoundError when there is none."""
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the artifacts' root is a directory, not a file")
    d = jobfiles.open_dir(anchor, root)
    try:
        for name in parts[:-1]:
            child = d.sub(name)
            d.close()
            d = child
        st = d.lstat(parts[-1])
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{'/'.join(parts)} is a directory")
        fh = d.open_file(parts[-1], max_size=max_size)
    finally:
        d.close()
    return fh, os.fstat(fh.fileno()).st_size
