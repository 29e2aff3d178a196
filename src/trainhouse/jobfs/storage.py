"""Where checkpoints live: a local directory or any fsspec URL, behind one small interface.

``open_storage(location)`` takes a local path, a ``file://`` URL (both: :class:`LocalStorage`,
durable write/fsync/rename/fsync-dir) or any other fsspec URL (``memory://``, ``s3://bucket/x``:
:class:`FsspecStorage`, write to a temp name then move). Every name a caller passes is relative to
the storage's root and confined to it (:func:`confine`). A local storage reads, lists and deletes
through :mod:`trainhouse.jobfs.jobfiles`: no link below its anchor (its root, or a trusted directory
above it) is followed, only regular files are read, and a deletion never goes through a link.

Writers never make a partial object visible under its final name: write ``temp_name(final)``,
then ``publish(tmp, final)``. Standard library only (fsspec is imported when a URL needs it,
blake3 when a digest needs it); the server imports this module, so it never imports torch.

Digests: a checkpoint's record names its algorithm (:data:`DIGESTS`; a record without one is
sha256, as every record was before blake3). File checkpoints are written with blake3 (several
times faster than sha256, and as strong); a directory's digest is always the sha256
:func:`tree_digest`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import shutil
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import unquote, urlsplit

from trainhouse.core.errors import CheckpointError
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.durable import fsync_dir, fsync_file, fsync_tree

__all__ = [
    "CHUNK",
    "DIGESTS",
    "FILE_DIGEST",
    "FsspecStorage",
    "LocalStorage",
    "Storage",
    "confine",
    "is_temp",
    "new_hash",
    "open_storage",
    "sidecar_name",
    "temp_name",
    "temp_pid",
    "tree_digest",
]

CHUNK = 1 << 20
#: the digest algorithms a checkpoint record may name; "sha256" where it names none
DIGESTS = ("sha256", "blake3")
#: what new file checkpoints are hashed with
FILE_DIGEST = "blake3"
_TEMP = re.compile(r"^\..+\.tmp-[0-9]+-[0-9a-f]+$")
_DRIVE = re.compile(r"^[A-Za-z]:")

# names for annotations inside Storage, whose `list` method shadows the builtin there
FileList = list[tuple[str, int]]
EntryList = list[tuple[str, str, int]]
NameList = list[str]
Failures = list[tuple[str, OSError]]  # names, each with why it was not deleted


def confine(rel: str) -> str:
    """``rel`` normalised ("a//b/./c/" -> "a/b/c"); refuses names that could leave the root.

    Raises CheckpointError for an empty name, an absolute path, a ".." component, a backslash or
    a NUL byte.
    """
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(f"a storage name must be a non-empty relative path, got {rel!r}")
    if "\x00" in rel or "\\" in rel:
        raise CheckpointError(f"a storage name must not hold a NUL byte or a backslash: {rel!r}")
    if rel.startswith("/") or _DRIVE.match(rel) or "://" in rel:
        raise CheckpointError(f"a storage name must be relative, got the absolute {rel!r}")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise CheckpointError(f"a storage name must not climb out with '..': {rel!r}")
    if not parts:
        raise CheckpointError(f"a storage name must name something below the root: {rel!r}")
    return "/".join(parts)


def new_hash(algorithm: str = "sha256") -> Any:
    """A new hash object (``update``, ``hexdigest``) of ``algorithm``, one of :data:`DIGESTS`;
    CheckpointError for any other."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError:
            raise CheckpointError(
                "this checkpoint's digest is blake3, and the blake3 package is not installed "
                "(pip install blake3)"
            ) from None
        return blake3.blake3()
    raise CheckpointError(
        f"unknown checkpoint digest algorithm {str(algorithm)[:40]!r} (known: {', '.join(DIGESTS)})"
    )


def tree_digest(entries: Iterable[tuple[str, str, int]]) -> str:
    """The digest of a directory: sha256 over its sorted ``"relpath sha256 size\\n"`` lines."""
    digest = hashlib.sha256()
    for line in sorted(f"{rel} {sha} {int(size)}\n" for rel, sha, size in entries):
        digest.update(line.encode())
    return str(digest.hexdigest())


def sidecar_name(path: str) -> str:
    """The JSON record the SDK keeps next to the checkpoint ``path`` (a file or a directory)."""
    return f"{path}.json"


def temp_name(rel: str) -> str:
    """A fresh sibling name for writing ``rel`` before it is published (hidden, unique)."""
    rel = confine(rel)
    head, base = posixpath.split(rel)
    name = f".{base}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return f"{head}/{name}" if head else name


def is_temp(name: str) -> bool:
    """True for a name made by :func:`temp_name` (a write that was never published)."""
    return bool(_TEMP.match(posixpath.basename(name)))


def temp_pid(name: str) -> int | None:
    """The process id recorded in a temp name."""
    if not is_temp(name):
        return None
    return int(posixpath.basename(name).rsplit(".tmp-", 1)[1].split("-", 1)[0])


def _sha256_stream(fh: BinaryIO, budget: list[int] | None = None, algorithm: str = "sha256") -> str:
    """sha256 (or ``algorithm``) hex of what ``fh`` holds; with ``budget`` (bytes left, shared
    across calls), a CheckpointError once more than that would be read."""
    digest = new_hash(algorithm)
    while chunk := fh.read(CHUNK):
        if budget is not None:
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise CheckpointError("more bytes than expected: the digest was not finished")
        digest.update(chunk)
    return str(digest.hexdigest())


class Storage:
    """A root for checkpoints; every ``rel`` is a confined name below it.

    Reading: exists, is_dir, size, digest, list, open_read, read_text, download, files.
    Writing: temp_name + open_write (or a directory writer) + publish, write_text, makedirs,
    delete. ``local_root`` is the directory when the storage is a local filesystem.
    """

    url: str
    local_root: Path | None = None

    # -- reading ---------------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def is_dir(self, rel: str) -> bool:
        raise NotImplementedError

    def files(self, rel: str) -> FileList:
        """Every file of the directory tree ``rel`` as (path relative to it, size), sorted."""
        raise NotImplementedError

    def list(self, prefix: str = "") -> NameList:
        """The names of the entries directly under ``prefix`` (the root by default), sorted."""
        raise NotImplementedError

    def open_read(self, rel: str) -> BinaryIO:
        raise NotImplementedError

    def size(self, rel: str) -> int:
        """A file's size, or the total bytes of a directory tree."""
        if self.is_dir(rel):
            return sum(size for _, size in self.files(rel))
        return self._file_size(rel)

    def entry(self, rel: str) -> tuple[bool, int] | None:
        """Whether ``rel`` is a directory, and its :meth:`size`; None when nothing is there
        (what :meth:`exists`, :meth:`is_dir` and :meth:`size` say, looked up once where the
        storage can)."""
        if not self.exists(rel):
            return None
        return self.is_dir(rel), self.size(rel)

    def _file_size(self, rel: str) -> int:
        raise NotImplementedError

    def tree_entries(self, rel: str, *, max_bytes: int | None = None) -> EntryList:
        """(relpath, sha256, size) of every file of the directory ``rel``; with ``max_bytes``,
        a CheckpointError rather than reading more than that in all."""
        return self.hash_files(rel, self.files(rel), max_bytes=max_bytes)

    def hash_files(
        self, rel: str, files: Iterable[tuple[str, int]], *, max_bytes: int | None = None
    ) -> EntryList:
        """(relpath, sha256, size) of the given files of the directory ``rel`` (as ``files``
        lists them): a share of :meth:`tree_entries`, for hashing a tree in parallel; with
        ``max_bytes``, a CheckpointError rather than reading more than that in all."""
        rel = confine(rel)
        budget = None if max_bytes is None else [max_bytes]
        out = []
        for sub, size in files:
            with self.open_read(f"{rel}/{confine(sub)}") as fh:
                out.append((sub, _sha256_stream(fh, budget), size))
        return out

    def digest(self, rel: str, *, max_bytes: int | None = None, algorithm: str = "sha256") -> str:
        """The hex digest (``algorithm``, default sha256) of a file; for a directory the
        :func:`tree_digest` of its files (always sha256). With ``max_bytes``, a CheckpointError
        rather than reading more than that."""
        if self.is_dir(rel):
            return tree_digest(self.tree_entries(rel, max_bytes=max_bytes))
        with self.open_read(rel) as fh:
            return _sha256_stream(fh, None if max_bytes is None else [max_bytes], algorithm)

    def read_bytes(self, rel: str, *, max_size: int | None = None) -> bytes:
        """The bytes of the file ``rel``; with ``max_size``, a CheckpointError rather than
        reading more than that."""
        with self.open_read(rel) as fh:
            if max_size is None:
                return fh.read()
            data = fh.read(max_size + 1)
        if len(data) > max_size:
            raise CheckpointError(f"{rel} is larger than {max_size} bytes")
        return data

    def read_text(self, rel: str, *, max_size: int | None = None) -> str:
        return self.read_bytes(rel, max_size=max_size).decode()

    def download(self, rel: str, dest: Path) -> Path:
        """Copy the file or directory tree ``rel`` to the local path ``dest``; returns ``dest``."""
        rel = confine(rel)
        dest = Path(dest)
        if self.is_dir(rel):
            dest.mkdir(parents=True, exist_ok=True)
            for sub, _ in self.files(rel):
                target = dest / sub
                target.parent.mkdir(parents=True, exist_ok=True)
                self._copy_out(f"{rel}/{sub}", target)
        elif self.exists(rel):
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._copy_out(rel, dest)
        else:
            raise FileNotFoundError(f"{self.url}: no {rel}")
        return dest

    def _copy_out(self, rel: str, dest: Path) -> None:
        with self.open_read(rel) as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, CHUNK)

    def local_path(self, rel: str) -> Path | None:
        """Where ``rel`` lies on this machine's filesystem, for a local storage; else None."""
        return None if self.local_root is None else self.local_root / confine(rel)

    def location(self, rel: str) -> str:
        """``rel`` as a path (local) or URL (fsspec) that other libraries can open."""
        raise NotImplementedError

    def free_bytes(self) -> int | None:
        """Bytes free where the storage writes, when that can be known (local), else None."""
        return None

    # -- writing ---------------------------------------------------------------------------
    def temp_name(self, rel: str) -> str:
        return temp_name(rel)

    def makedirs(self, rel: str = "") -> None:
        raise NotImplementedError

    def open_write(self, rel: str) -> BinaryIO:
        """A new file ``rel`` open for writing (parents created); write to a temp name."""
        raise NotImplementedError

    def publish(self, tmp: str, final: str) -> None:
        """Make the fully written file or directory ``tmp`` durable and move it to ``final``.

        Replaces an existing ``final``. Nothing is visible under ``final`` before every byte
        of ``tmp`` is.
        """
        raise NotImplementedError

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``rel`` atomically (temp name, then publish)."""
        rel = confine(rel)
        tmp = self.temp_name(rel)
        try:
            with self.open_write(tmp) as fh:
                fh.write(data)
            self.publish(tmp, rel)
        except BaseException:
            with contextlib.suppress(Exception):
                self.delete(tmp)
            raise

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def delete(self, rel: str) -> None:
        """Remove the file or directory tree ``rel``; a missing one is fine."""
        raise NotImplementedError

    def delete_many(self, rels: Iterable[str]) -> Failures:
        """:meth:`delete` each of ``rels``, in order, on past a failure; the ones that
        failed, with why."""
        failed: Failures = []
        for rel in rels:
            try:
                self.delete(rel)
            except OSError as exc:
                failed.append((rel, exc))
        return failed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


class LocalStorage(Storage):
    """A directory on a local (or mounted) filesystem; writes are fsynced and renamed.

    Reads, listings and deletions go through :mod:`trainhouse.jobfs.jobfiles` from ``anchor`` (the
    root unless a trusted directory above it is given): a link anywhere below the anchor is
    refused (``jobfiles.UnsafeFile``, an OSError), only regular files with one link are read,
    and a deletion removes what is there, never what a link names.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        url: str | None = None,
        anchor: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
        self.local_root = self.root
        self.url = url or str(self.root)
        self.anchor = self.root if anchor is None else Path(os.path.abspath(os.fspath(anchor)))
        jobfiles.below(self.anchor, self.root)  # ValueError unless the root is under it

    def _p(self, rel: str) -> Path:
        return self.root / confine(rel)

    def _dir(self, prefix: str) -> Path:
        return self.root if prefix in ("", ".", "/") else self._p(prefix)

    def location(self, rel: str) -> str:
        return str(self._p(rel))

    def _lstat(self, rel: str) -> os.stat_result | None:
        return jobfiles.lstat(self.anchor, self._p(rel))

    def exists(self, rel: str) -> bool:
        """True when something is at ``rel`` (a link or a FIFO too: reading it is refused)."""
        return self._lstat(rel) is not None

    def is_dir(self, rel: str) -> bool:
        st = self._lstat(rel)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def _file_size(self, rel: str) -> int:
        with self.open_read(rel) as fh:
            return os.fstat(fh.fileno()).st_size

    def entry(self, rel: str) -> tuple[bool, int] | None:
        # one walk from the anchor to its directory, not one to look and one to open
        full = self._p(rel)
        try:
            d = jobfiles.open_dir(self.anchor, full.parent)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with d:
            st = d.lstat(full.name)
            if st is None:
                return None
            if not stat.S_ISDIR(st.st_mode):
                with d.open_file(full.name) as fh:  # a link, a FIFO, ... is refused here
                    return False, os.fstat(fh.fileno()).st_size
        return True, sum(size for _, size in self.files(rel))

    def files(self, rel: str) -> FileList:
        try:
            return jobfiles.walk(self.anchor, self._p(rel))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list(self, prefix: str = "") -> NameList:
        try:
            with jobfiles.open_dir(self.anchor, self._dir(prefix)) as d:
                return [name for name, _ in d.entries()]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def open_read(self, rel: str) -> BinaryIO:
        return jobfiles.open_file(self.anchor, self._p(rel))

    def read_bytes(self, rel: str, *, max_size: int | None = None) -> bytes:
        if max_size is None:
            return super().read_bytes(rel)
        return jobfiles.read_file(self.anchor, self._p(rel), max_size=max_size)

    def free_bytes(self) -> int | None:
        path = self.root
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None

    def makedirs(self, rel: str = "") -> None:
        self._dir(rel).mkdir(parents=True, exist_ok=True)

    def open_write(self, rel: str) -> BinaryIO:
        path = self._p(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("wb")

    def publish(self, tmp: str, final: str) -> None:
        src, dst = self._p(tmp), self._p(final)
        if src.is_dir():
            fsync_tree(src)
            old = None
            if dst.exists():  # a directory cannot be renamed over a non-empty one
                old = dst.with_name(posixpath.basename(self.temp_name(final)))
                os.replace(dst, old)
            os.replace(src, dst)
            fsync_dir(dst.parent)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            fsync_file(src)
            os.replace(src, dst)
            fsync_dir(dst.parent)

    def delete(self, rel: str) -> None:
        """Remove the file or directory tree ``rel``; a link is removed itself, and nothing is
        removed through a link on the way (``jobfiles.UnsafeFile``)."""
        jobfiles.remove(self.anchor, self._p(rel))

    def delete_many(self, rels: Iterable[str]) -> Failures:
        """:meth:`delete` each of ``rels`` (on past a failure; the ones that failed, with
        why), the entries of one directory through one walk to it from the anchor, not one
        each (retention deletes a batch of checkpoints and their records at a time)."""
        by_parent: dict[Path, list[tuple[str, str]]] = {}
        failed: Failures = []
        for rel in rels:
            full = self._p(rel)  # a name that escapes: CheckpointError, as delete raises
            by_parent.setdefault(full.parent, []).append((rel, full.name))
        for parent, names in by_parent.items():
            try:
                d = jobfiles.open_dir(self.anchor, parent)
            except (FileNotFoundError, NotADirectoryError):
                continue  # nothing there to remove
            except OSError as exc:  # a link on the way: nothing is removed through it
                failed.extend((rel, exc) for rel, _ in names)
                continue
            with d:
                for rel, name in names:
                    try:
                        d.remove(name)
                    except OSError as exc:
                        failed.append((rel, exc))
        return failed


class FsspecStorage(Storage):
    """A root on any fsspec filesystem (``memory://``, ``s3://bucket/prefix``, ``file://``).

    Publishing moves the temp object to its final name (a rename where the filesystem has one,
    copy + delete on object stores); callers write their record only after it.
    """

    def __init__(self, url: str, **options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/") or url
        # no cached listings: the job's own processes write here while the server reads (a
        # listing s3fs cached made a checkpoint written since look missing to the server)
        options.setdefault("use_listings_cache", False)
        fs, path = fsspec.core.url_to_fs(url, **options)
        self.fs = fs
        self.root = str(path).rstrip("/")
        self._protocol = url.split("://", 1)[0] if "://" in url else "file"

    def _p(self, rel: str) -> str:
        return f"{self.root}/{confine(rel)}"

    def _dir(self, prefix: str) -> str:
        return (self.root or "/") if prefix in ("", ".", "/") else self._p(prefix)

    def location(self, rel: str) -> str:
        path = self._p(rel)
        return cast(str, self.fs.unstrip_protocol(path))

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self._p(rel)))

    def is_dir(self, rel: str) -> bool:
        return bool(self.fs.isdir(self._p(rel)))

    def _file_size(self, rel: str) -> int:
        return int(self.fs.size(self._p(rel)))

    def files(self, rel: str) -> FileList:
        base = self._p(rel)
        found = self.fs.find(base, detail=True)
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            sub = posixpath.relpath(self.fs._strip_protocol(path), self.fs._strip_protocol(base))
            out.append((sub, int(info.get("size") or 0)))
        return sorted(out)

    def list(self, prefix: str = "") -> NameList:
        path = self._dir(prefix)
        try:
            if not self.fs.isdir(path):
                return []
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = self.fs._strip_protocol(path).rstrip("/")
        names = {
            posixpath.basename(str(self.fs._strip_protocol(e)).rstrip("/"))
            for e in entries
            if str(self.fs._strip_protocol(e)).rstrip("/") != base
        }
        return sorted(n for n in names if n)

    def open_read(self, rel: str) -> BinaryIO:
        return cast(BinaryIO, self.fs.open(self._p(rel), "rb"))

    def makedirs(self, rel: str = "") -> None:
        self.fs.makedirs(self._dir(rel), exist_ok=True)

    def open_write(self, rel: str) -> BinaryIO:
        path = self._p(rel)
        self.fs.makedirs(posixpath.dirname(path) or "/", exist_ok=True)
        return cast(BinaryIO, self.fs.open(path, "wb"))

    def publish(self, tmp: str, final: str) -> None:
        src, dst = self._p(tmp), self._p(final)
        if self.fs.isdir(src):
            if self.fs.exists(dst):
                self.fs.rm(dst, recursive=True)
            # file by file: on an object store a recursive move also lists the directory's own
            # pseudo-key, whose copy fails (s3fs: NoSuchKey)
            for sub, _ in self.files(tmp):
                target = f"{dst}/{sub}"
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
                self.fs.mv(f"{src}/{sub}", target)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(src, recursive=True)
        else:
            self.fs.mv(src, dst)
        self.fs.invalidate_cache()

    def delete(self, rel: str) -> None:
        path = self._p(rel)
        with contextlib.suppress(FileNotFoundError):
            if self.fs.exists(path):
                self.fs.rm(path, recursive=self.fs.isdir(path))
        self.fs.invalidate_cache()


def open_storage(
    location: str | os.PathLike[str] | Storage, *, anchor: str | os.PathLike[str] | None = None
) -> Storage:
    """The storage at ``location``: a local path, a ``file://`` URL or any fsspec URL.

    ``anchor``, for a local one: a trusted directory above the root, from which no link is
    followed (by default the root itself).
    """
    if isinstance(location, Storage):
        return location
    loc = os.fspath(location)
    if "://" not in loc:
        return LocalStorage(loc, anchor=anchor)
    scheme = loc.split("://", 1)[0].lower()
    if scheme == "file":
        parts = urlsplit(loc)
        if parts.netloc not in ("", "localhost"):
            raise CheckpointError(f"a file:// URL must name a local path, got {loc!r}")
        path = unquote(parts.path)
        if not path:
            raise CheckpointError(f"a file:// URL must name a directory, got {loc!r}")
        root = os.path.abspath(path)
        return LocalStorage(root, url=f"file://{root}", anchor=anchor)
    return FsspecStorage(loc)
