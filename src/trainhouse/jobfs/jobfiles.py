"""Opening the files a job's processes write: no link followed, regular files only, bounded.

Everything under a job's directories is in the hands of its processes. Where the server expects
a log, a checkpoint or a small JSON record, a job can leave a symbolic link (to another job's
files, to the database, to ``/dev/zero``), a hard link to a file outside it, a FIFO (whose
``open`` waits for a writer that never comes), a socket, a directory, or a sparse file of
terabytes. The server therefore opens every path a job writes through this module:

- the path is walked one component at a time from a trusted ``anchor`` (the server's home, a
  checkpoint base directory, a Ray node agent's own directory), each directory opened with
  ``O_NOFOLLOW`` relative to its parent's descriptor: a link anywhere below the anchor is
  refused, and what was checked is what is read (no check-then-open race);
- a file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO cannot block the open) and kept only
  when ``fstat`` says it is a regular file with one link;
- a record's read has a cap, checked on the size before anything is read, and never reads
  more than the cap even if the file grows meanwhile (a checkpoint is streamed in chunks);
- a listing reports each entry as ``lstat`` sees it (never through a link), up to a cap;
- a removal walks the same way and removes the entry itself: a file, a link or anything else
  that is not a directory is unlinked, a directory emptied the same way, one descriptor at a
  time, never opening a link or waiting on a FIFO;
- a write goes through no link either: an append opens only a regular file with one link
  (created if missing), and a replacement is written to a fresh name (``O_EXCL``) and renamed
  over whatever entry was there.

Refusals raise :class:`UnsafeFile`, an ``OSError``: code that treats an unreadable file as
missing keeps doing so. The anchor itself may be a link (an operator's choice). Standard
library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from pathlib import Path
from typing import BinaryIO, Self, cast

from trainhouse.core.errors import UnsafeFile

__all__ = [
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "MAX_RECORD",
    "MAX_REMOVE_DEPTH",
    "MAX_SPOOL_FILE",
    "MAX_SPOOL_FILES",
    "MAX_SPOOL_TOTAL",
    "Dir",
    "UnsafeFile",
    "below",
    "is_file",
    "kind",
    "lstat",
    "open_append",
    "open_dir",
    "open_file",
    "read_file",
    "remove",
    "walk",
    "write_file",
]

#: a small record: a checkpoint's ``.json`` sidecar, an exit record
MAX_RECORD = 1 << 20
#: entries of one directory listed, files of one sharded checkpoint
MAX_ENTRIES = 100_000
#: directory levels below a sharded checkpoint
MAX_DEPTH = 64
#: directory levels a removal descends (deeper ones are left)
MAX_REMOVE_DEPTH = 256
#: one spooled metric batch (the limit of a live report's body)
MAX_SPOOL_FILE = 64 << 20
#: spooled batches of one attempt, and their bytes together
MAX_SPOOL_FILES = 4096
MAX_SPOOL_TOTAL = 1 << 30

PathLike = str | os.PathLike[str]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_APPEND = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | os.O_NOCTTY
    | os.O_CLOEXEC
)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def kind(st: os.stat_result) -> str:
    """What an ``lstat`` result is, in words ("a FIFO", "a symbolic link", ...)."""
    mode = st.st_mode
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "of an unknown type"


def below(anchor: PathLike, path: PathLike) -> list[str]:
    """The components of ``path`` under ``anchor`` (both made absolute, never resolved).

    Raises ValueError when ``path`` does not lie under ``anchor``.
    """
    top = os.path.abspath(os.fspath(anchor))
    full = os.path.abspath(os.fspath(path))
    if full == top:
        return []
    rel = posixpath.relpath(full, top)
    if rel == ".." or rel.startswith("../"):
        raise ValueError(f"{full} is not under {top}")
    return rel.split("/")


def _refuse(exc: OSError, where: str, dir_fd: int, name: str) -> OSError:
    """The error to raise for a failed ``open`` of the job-written entry ``name``."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW on a link: ELOOP, or ENOTDIR
        with contextlib.suppress(OSError):  # with O_DIRECTORY
            if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return UnsafeFile(
                    errno.ELOOP, f"{where} is a symbolic link; links are not followed"
                )
    if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened to write with no reader
        return UnsafeFile(errno.ENXIO, f"{where} is not a regular file")
    return type(exc)(exc.errno, exc.strerror, where)


def _check_regular(fd: int, where: str, max_size: int | None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(errno.EINVAL, f"{where} is {kind(st)}, not a regular file")
    if st.st_nlink > 1:
        raise UnsafeFile(errno.EMLINK, f"{where} has {st.st_nlink} hard links; only one is read")
    if max_size is not None and st.st_size > max_size:
        raise UnsafeFile(
            errno.EFBIG, f"{where} is {st.st_size} bytes, over the {max_size}-byte limit"
        )
    return st


class Dir:
    """A directory opened without following a link; its entries are read the same way.

    Names passed to its methods are single components (no ``/``). Close it, or use it as a
    context manager.
    """

    def __init__(self, fd: int, where: str) -> None:
        self.fd = fd
        self.where = where

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _name(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a single path component: {name!r}")
        return f"{self.where}/{name}"

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` as it is (a link is not followed); None when there is none."""
        self._name(name)
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def entries(self, *, limit: int = MAX_ENTRIES) -> list[tuple[str, os.stat_result]]:
        """Every entry with its ``lstat``, sorted by name; UnsafeFile beyond ``limit``."""
        out: list[tuple[str, os.stat_result]] = []
        with os.scandir(self.fd) as found:
            for entry in found:
                if len(out) >= limit:
                    raise UnsafeFile(errno.E2BIG, f"{self.where} holds more than {limit} entries")
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue  # removed as we looked
        return sorted(out, key=lambda item: item[0])

    def sub(self, name: str) -> Dir:
        """The directory ``name`` in this one (UnsafeFile for a link, NotADirectoryError for
        anything else that is not a directory)."""
        where = self._name(name)
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError as exc:
            raise _refuse(exc, where, self.fd, name) from None
        return Dir(fd, where)

    def open_file(self, name: str, *, max_size: int | None = None) -> BinaryIO:
        """The regular file ``name``, open for reading; refused (UnsafeFile) when it is
        anything else, has more than one link, or is over ``max_size`` bytes."""
        where = self._name(name)
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except OSError as exc:
            raise _refuse(exc, where, self.fd, name) from None
        try:
            _check_regular(fd, where, max_size)
            os.set_blocking(fd, True)
            return cast(BinaryIO, open(fd, "rb", closefd=True))
        except BaseException:
            os.close(fd)
            raise

    def read(self, name: str, *, max_size: int = MAX_RECORD) -> bytes:
        """The bytes of the regular file ``name``: at most ``max_size`` of them (a file that
        is, or grows, larger is refused)."""
        with self.open_file(name, max_size=max_size) as fh:
            data = fh.read(max_size + 1)
        if len(data) > max_size:
            where = self._name(name)
            raise UnsafeFile(errno.EFBIG, f"{where} grew past the {max_size}-byte limit")
        return data

    def open_append(self, name: str) -> BinaryIO:
        """The regular file ``name`` open for appending, created if missing (never a link,
        a FIFO or anything else that is there instead)."""
        where = self._name(name)
        try:
            fd = os.open(name, _APPEND, 0o666, dir_fd=self.fd)
        except OSError as exc:
            raise _refuse(exc, where, self.fd, name) from None
        try:
            _check_regular(fd, where, None)
            os.set_blocking(fd, True)
            return cast(BinaryIO, open(fd, "ab", closefd=True))
        except BaseException:
            os.close(fd)
            raise

    def write(self, name: str, data: bytes) -> None:
        """Make ``name`` a regular file holding ``data``: written to a fresh name (``O_EXCL``,
        never through a link, never into a FIFO) and renamed over whatever entry was there."""
        self._name(name)
        tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(tmp, _CREATE, 0o666, dir_fd=self.fd)
        try:
            with open(fd, "wb", closefd=True) as fh:
                fh.write(data)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def create_temp(self, name: str) -> tuple[str, BinaryIO]:
        """A fresh regular file (``O_EXCL``, never through a link) to write ``name`` in pieces:
        its temporary name and the file open for writing; :meth:`rename` it over ``name`` when
        it is complete, :meth:`unlink` it otherwise."""
        self._name(name)
        tmp = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(tmp, _CREATE, 0o666, dir_fd=self.fd)
        return tmp, cast(BinaryIO, open(fd, "wb", closefd=True))

    def make_sub(self, name: str) -> Dir:
        """The directory ``name`` in this one, made if missing (never through a link)."""
        self._name(name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=self.fd)
        return self.sub(name)

    def unlink(self, name: str) -> None:
        """Remove the entry ``name`` (not a directory); a link goes, never what it names."""
        self._name(name)
        os.unlink(name, dir_fd=self.fd)

    def rename(self, name: str, new: str) -> None:
        """Rename the entry ``name`` to ``new`` within this directory."""
        self._name(name)
        self._name(new)
        os.rename(name, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove the entry ``name``: a directory with everything in it (as much as can be,
        like ``shutil.rmtree(ignore_errors=True)``), anything else unlinked. No link is
        followed, and no open waits: a directory swapped for a link or a FIFO meanwhile is
        unlinked as what it has become. A missing entry is fine."""
        st = self.lstat(name)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            self._remove_tree(name, MAX_REMOVE_DEPTH)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)

    def _remove_tree(self, name: str, depth: int) -> None:
        try:
            child = self.sub(name)
        except (NotADirectoryError, UnsafeFile):  # no longer a directory
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
            return
        except OSError:
            return
        with child:
            try:
                found = child.entries(limit=1 << 62)
            except OSError:
                found = []
            for entry, st in found:
                if stat.S_ISDIR(st.st_mode) and depth > 0:
                    child._remove_tree(entry, depth - 1)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry, dir_fd=child.fd)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=self.fd)

    def files(self, *, limit: int = MAX_ENTRIES, depth: int = MAX_DEPTH) -> list[tuple[str, int]]:
        """(path relative to this directory, size) of every regular file below it, sorted;
        UnsafeFile for a link, a FIFO, a socket, a hard-linked file, more than ``limit``
        entries in all or more than ``depth`` levels."""
        out: list[tuple[str, int]] = []
        budget = [limit]
        try:
            self._files("", out, budget, depth)
        except UnsafeFile as exc:
            if exc.errno == errno.E2BIG:  # one directory's entries, or all together
                raise UnsafeFile(
                    errno.E2BIG, f"{self.where} holds more than {limit} entries"
                ) from None
            raise
        return sorted(out)

    def _files(
        self, prefix: str, out: list[tuple[str, int]], budget: list[int], depth: int
    ) -> None:
        for name, st in self.entries(limit=budget[0]):
            budget[0] -= 1
            if stat.S_ISDIR(st.st_mode):
                if depth <= 0:
                    raise UnsafeFile(
                        errno.ENAMETOOLONG, f"{self.where}/{name} is nested too deeply"
                    )
                with self.sub(name) as child:
                    child._files(f"{prefix}{name}/", out, budget, depth - 1)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                out.append((f"{prefix}{name}", st.st_size))
            else:
                what = "a hard-linked file" if stat.S_ISREG(st.st_mode) else kind(st)
                raise UnsafeFile(errno.EINVAL, f"{self.where}/{name} is {what}")


def open_dir(anchor: PathLike, path: PathLike) -> Dir:
    """The directory ``path``, walked down from ``anchor`` without following a link.

    FileNotFoundError when a component is missing, NotADirectoryError when one is not a
    directory, UnsafeFile when one is a link; ValueError when ``path`` is not under ``anchor``.
    """
    parts = below(anchor, path)
    fd = os.open(os.fspath(anchor), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = os.path.abspath(os.fspath(anchor))
    try:
        for part in parts:
            where = f"{where}/{part}"
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                raise _refuse(exc, where, fd, part) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return Dir(fd, where)


def _split(anchor: PathLike, path: PathLike) -> tuple[Path, str]:
    full = Path(os.path.abspath(os.fspath(path)))
    if not below(anchor, full):
        raise ValueError(f"{full} is the anchor itself, not a file below it")
    return full.parent, full.name


def open_file(anchor: PathLike, path: PathLike, *, max_size: int | None = None) -> BinaryIO:
    """The regular file ``path`` under ``anchor`` open for reading (see :meth:`Dir.open_file`)."""
    parent, name = _split(anchor, path)
    with open_dir(anchor, parent) as d:
        return d.open_file(name, max_size=max_size)


def read_file(anchor: PathLike, path: PathLike, *, max_size: int = MAX_RECORD) -> bytes:
    """The bytes of the regular file ``path`` under ``anchor``, at most ``max_size``."""
    parent, name = _split(anchor, path)
    with open_dir(anchor, parent) as d:
        return d.read(name, max_size=max_size)


def open_append(anchor: PathLike, path: PathLike) -> BinaryIO:
    """The regular file ``path`` under ``anchor`` open for appending, created if missing."""
    parent, name = _split(anchor, path)
    with open_dir(anchor, parent) as d:
        return d.open_append(name)


def write_file(anchor: PathLike, path: PathLike, data: bytes) -> None:
    """Replace ``path`` under ``anchor`` with a regular file holding ``data`` (see
    :meth:`Dir.write`); its directory is reached without following a link."""
    parent, name = _split(anchor, path)
    with open_dir(anchor, parent) as d:
        d.write(name, data)


def lstat(anchor: PathLike, path: PathLike) -> os.stat_result | None:
    """The entry ``path`` under ``anchor`` as it is (no link followed on the way or at the
    end); None when it, or a directory on the way, is missing or not a directory."""
    parent, name = _split(anchor, path)
    try:
        with open_dir(anchor, parent) as d:
            return d.lstat(name)
    except (FileNotFoundError, NotADirectoryError):
        return None


def is_file(anchor: PathLike, path: PathLike) -> bool:
    """True when ``path`` under ``anchor`` is a regular file reached without a link."""
    try:
        st = lstat(anchor, path)
    except OSError:
        return False
    return st is not None and stat.S_ISREG(st.st_mode)


def walk(
    anchor: PathLike, path: PathLike, *, limit: int = MAX_ENTRIES, depth: int = MAX_DEPTH
) -> list[tuple[str, int]]:
    """(path relative to ``path``, size) of every regular file of the directory tree
    ``path`` under ``anchor``, sorted (see :meth:`Dir.files` for what is refused)."""
    with open_dir(anchor, path) as d:
        return d.files(limit=limit, depth=depth)


def remove(anchor: PathLike, path: PathLike) -> None:
    """Remove the file or directory tree ``path`` under ``anchor`` without following a link
    (a link is itself removed); a missing one is fine. UnsafeFile when a directory on the way
    is a link: nothing is removed then."""
    parent, name = _split(anchor, path)
    try:
        d = open_dir(anchor, parent)
    except (FileNotFoundError, NotADirectoryError):
        return
    with d:
        d.remove(name)
