"""The file operations of a node's caches that never follow a link: flocks on lock files an
exclusive holder may unlink, directories walked and made level by level through descriptors
opened with ``O_NOFOLLOW`` (a symlink swapped in fails the write, it never leads it elsewhere),
hard links with a copy where a link is refused, removals of what a link or a crash left.
Standard library only (:mod:`trainhouse.jobfs.datacache` is its user)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from trainhouse.core.errors import StagingError

CHUNK = 1 << 20  # bytes copied at once where a hard link is refused
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def flock(path: Path, how: int) -> int | None:
    """``path`` opened and flocked (``LOCK_SH`` or ``LOCK_EX``, with ``LOCK_NB`` not waiting):
    the descriptor, closed to release, or None when another holds it and ``LOCK_NB``. A lock file
    unlinked meanwhile (by its exclusive holder) is opened and taken again."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            unlink(path)  # a symlink planted there: no one's lock
            continue
        try:
            fcntl.flock(fd, how)
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except BlockingIOError:
            os.close(fd)
            return None
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path, how: int, *, drop: bool = False) -> Iterator[int | None]:
    """:func:`flock` for a block; ``drop``: the lock file unlinked before it is released (only
    with ``LOCK_EX``)."""
    fd = flock(path, how)
    try:
        yield fd
    finally:
        if fd is not None:
            if drop:
                unlink(path)
            os.close(fd)


class Tree:
    """The view being built, written through directory descriptors opened without following a
    symlink, one per level of the current directory: a symlink swapped in fails the build, it
    never leads a write outside. Files come sorted by path, so a directory's are consecutive:
    it is sealed (0555) when left; the top one is left writable (for its rename)."""

    def __init__(self, top: Path) -> None:
        self.fds, self.parts = [os.open(top, _DIR)], list[str]()

    def dir(self, path: str) -> tuple[int, str]:
        """The directory of ``path`` (made), as a descriptor, and its name in it."""
        *parts, name = path.split("/")
        if any(p in ("", ".", "..") for p in (*parts, name)):
            raise StagingError(f"dataset file {path!r}: refused, its path leaves its version")
        keep = 0
        while keep < min(len(parts), len(self.parts)) and parts[keep] == self.parts[keep]:
            keep += 1
        self._leave(keep)
        for part in parts[keep:]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=self.fds[-1])
            try:
                self.fds.append(os.open(part, _DIR, dir_fd=self.fds[-1]))
            except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
                at = "/".join([*self.parts, part])
                raise StagingError(f"dataset file {path!r}: refused, {at!r} in its view is "
                                   f"not a directory ({exc.strerror})") from exc  # fmt: skip
            self.parts.append(part)
        return self.fds[-1], name

    def _leave(self, depth: int) -> None:
        while len(self.parts) > depth:
            self.parts.pop()
            fd = self.fds.pop()
            try:
                os.fchmod(fd, 0o555)
            finally:
                os.close(fd)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._leave(0)
        finally:
            os.close(self.fds.pop())


def reusable(path: Path, size: int, *, discard: bool = False) -> bool:
    """An object already published: a regular file (no link followed) of the registered size.
    ``discard`` (under the object's lock): a wrong one is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and st.st_size == size:
        return True
    if discard:
        remove_entry(path)
    return False


def link(obj: Path, where: int, name: str) -> None:
    """A hard link to the object at ``name`` in the directory ``where``; a copy where the file
    system refuses one (too many links to one file, ``fs.protected_hardlinks``)."""
    try:
        os.link(obj, name, dst_dir_fd=where, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EMLINK, errno.EPERM):
            raise
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o444, dir_fd=where)
        with open(obj, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)


def entries(path: Path, *, dirs: bool) -> list[os.DirEntry[str]]:
    """``path``'s entries (``dirs``: only real directories, no symlink followed)."""
    try:
        with os.scandir(path) as found:
            return [e for e in found if not dirs or e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def make_dir(path: Path) -> None:
    """``path`` as a real directory: a symlink or a file planted there is removed."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return
        remove_entry(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)


def remove_entry(path: Path) -> None:
    """Remove whatever is at ``path`` without following a symlink; a read-only tree is made
    writable first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        unlink(path)
        return
    for sub, _dirs, _files in os.walk(path):  # no symlink followed: real directories only
        with contextlib.suppress(OSError):
            os.chmod(sub, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def touch(path: Path) -> None:
    """Create ``path`` or set its time to now (never through a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        remove_entry(path)  # a symlink or a directory planted there
        fd = os.open(path, flags, 0o644)
    try:
        now = time.time_ns()
        os.utime(fd, ns=(now, now))
    finally:
        os.close(fd)


def mtime(path: Path) -> float:
    with contextlib.suppress(OSError):
        return os.lstat(path).st_mtime
    return 0.0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
