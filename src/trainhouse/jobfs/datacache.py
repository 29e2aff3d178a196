"""The dataset cache of one node: the files of a pinned version (:mod:`trainhouse.core.datasets`)
fetched once per node, verified, and handed to the ranks as a read-only directory.

Layout under the cache's root::

    objects/<algorithm>/<hex[:2]>/<hex>   a file's bytes, addressed by its digest, mode 0444
    views/<manifest digest>/...           a version's tree: hard links to the objects, dirs 0555
    .ready/<digest>                       the view is complete (written last, removed first)
    .used/<digest>                        touched at every stage: least recently used order
    .locks/                               flock files
    .tmp/                                 downloads and views being built, renamed into place

Versions sharing a file share its bytes; jobs of every user share one copy. A view holds only
the version's files (the job lists it). An object is published by an atomic rename once its size
and digest are checked; a view by an atomic rename of a tree built in ``.tmp``, then its marker.
A view without its marker (half-built, half-removed) is never used: it is rebuilt.

Locks (``flock``): ``view.<digest>.use`` is held shared by every :class:`Staged` not released
(and by a stage in progress); removal takes it exclusively without waiting, so a view in use is
never removed. ``view.<digest>.build`` is held exclusively while a view is built: processes
staging one version at once build it once. ``<algorithm>.<hex>`` is held exclusively while an
object is checked, fetched and linked into the view being built: a file is fetched once per node
even by two versions staged at once, and prune drops an object only under it, only while no view
links it (``st_nlink`` 1). A lock file is unlinked only by the holder of its exclusive lock, and
:func:`~trainhouse.jobfs.cachefiles.flock` takes again one replaced meanwhile, so ``.locks``
does not grow with the objects.

A ``.tmp`` entry is named after the lock its owner holds (``<lock>~<random>``): one whose lock is
free, left by a killed process, is removed at the next build. No symlink in the cache is ever
followed: a planted one is removed. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from trainhouse.core.datasets import FileEntry, Manifest
from trainhouse.core.errors import StagingError
from trainhouse.jobfs.cachefiles import (
    Tree,
    entries,
    flock,
    fsync_dir,
    link,
    locked,
    make_dir,
    mtime,
    remove_entry,
    reusable,
    touch,
    unlink,
)

__all__ = ["RETRY_DELAYS", "CachedView", "DataCache", "Fetch", "Staged"]

#: seconds slept before each new try of a transient failure (a timeout, a dropped connection)
RETRY_DELAYS: tuple[float, ...] = (0.5, 2.0)
CHUNK = 1 << 20  # bytes read from a source at once
FETCHERS = 8  # objects fetched at once (a store's latency overlaps; one file's bytes in order)
PROGRESS_STEP = 1 << 20  # bytes between two progress reports
STALE_SECONDS = 3600  # a .tmp entry no lock names is removed past this age
_TMP_LOCK = re.compile(r"view\.[0-9a-f]{64}\.build|(?:sha256|md5)\.[0-9a-f]{32,64}")
_TRY = fcntl.LOCK_EX | fcntl.LOCK_NB  # an exclusive lock, not waited for
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: opens a file of a version at its source: ``fetch(entry)`` gives a context manager of a stream
Fetch = Callable[[FileEntry], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class CachedView:
    """One ready version of a cache."""

    digest: str  # the manifest's
    size: int  # bytes, each object counted once
    last_used: float  # epoch seconds
    in_use: bool  # a Staged not released holds it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Staged:
    """A ready version, held: no prune removes :attr:`path` until :meth:`release`."""

    path: Path  # the view: what a rank is given
    digest: str
    fetched_bytes: int  # bytes this stage downloaded
    reused: int  # files already in the cache
    _fd: int | None = field(default=None, repr=False)  # the view's use lock, held shared

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Progress:
    """``callback(done, total)`` every :data:`PROGRESS_STEP` bytes and at the end; a download
    tried again rewinds :attr:`done`, and nothing is reported until it passes the last report."""

    def __init__(self, total: int, callback: Callable[[int, int], None] | None) -> None:
        self.total, self.callback, self.done, self._shown = total, callback, 0, -1
        self._lock = threading.Lock()  # the fetchers add from their threads

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self.done - self._shown >= PROGRESS_STEP:
                self._report()

    def finish(self) -> None:
        with self._lock:
            self._report()

    def _report(self) -> None:
        if self.callback is not None and self.done > self._shown:
            self._shown = self.done
            self.callback(self.done, self.total)


class DataCache:
    """The dataset cache at ``root``, bounded by ``max_bytes`` (0: no limit). Past its limit,
    :meth:`stage` removes the least recently used versions no job holds; a version larger than
    the limit alone is staged anyway (and said so)."""

    def __init__(self, root: Path, max_bytes: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError(f"a dataset cache's limit is 0 (none) or bytes, not {max_bytes}")
        self.root, self.max_bytes = Path(root), max_bytes
        self._objects, self._views = self.root / "objects", self.root / "views"
        self._ready, self._used = self.root / ".ready", self.root / ".used"
        self._locks, self._tmp = self.root / ".locks", self.root / ".tmp"

    def stage(
        self,
        manifest: Manifest,
        fetch: Fetch,
        *,
        progress: Callable[[int, int], None] | None = None,
        out: Callable[[str], None] | None = None,
    ) -> Staged:
        """Make the version's view ready (fetching what the cache lacks) and hold it; raises
        :class:`StagingError` naming the file and the cause."""
        digest = manifest.digest
        self._layout()
        bar = _Progress(manifest.size, progress)
        use = flock(self._locks / f"view.{digest}.use", fcntl.LOCK_SH)
        assert use is not None  # a lock waited for
        try:
            fetched, reused = 0, len(manifest.files)
            if not self.is_ready(digest):
                with locked(self._locks / f"view.{digest}.build", fcntl.LOCK_EX, drop=True):
                    if not self.is_ready(digest):
                        fetched, reused = self._build(manifest, fetch, bar, out)
            bar.done = manifest.size
            bar.finish()
            touch(self._used / digest)
        except BaseException:
            os.close(use)
            raise
        return Staged(self._views / digest, digest, fetched, reused, use)

    def is_ready(self, digest: str) -> bool:
        try:
            marker, view = os.lstat(self._ready / digest), os.lstat(self._views / digest)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return stat.S_ISREG(marker.st_mode) and stat.S_ISDIR(view.st_mode)

    def usage(self) -> list[CachedView]:
        """The ready versions, least recently used first."""
        if not self.root.is_dir():
            return []
        self._layout()
        return [view for view, _inodes in self._scan_views()]

    def total_bytes(self) -> int:
        """The bytes of every object (shared ones once), linked by a view or not."""
        return sum(size for _path, _key, size in self._scan_objects().values())

    def prune(self, max_bytes: int) -> list[CachedView]:
        """Remove the objects no view links, then the least recently used versions not in use
        (and what only they linked), until the cache holds at most ``max_bytes`` (0: all but
        the versions in use); the versions removed."""
        return self._prune(max_bytes, set())[0]

    # -- building a view

    def _layout(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for path in (self._objects, self._views, self._ready, self._used, self._locks, self._tmp):
            make_dir(path)

    def _object(self, key: str, made: set[str]) -> Path:
        algorithm, _, hexdigest = key.partition(":")
        shard = self._objects / algorithm / hexdigest[:2]
        if algorithm + hexdigest[:2] not in made:
            make_dir(shard.parent)
            make_dir(shard)
            made.add(algorithm + hexdigest[:2])
        return shard / hexdigest

    def _build(
        self, manifest: Manifest, fetch: Fetch, bar: _Progress, out: Callable[[str], None] | None
    ) -> tuple[int, int]:
        """Under the view's build lock: the view built in ``.tmp``, renamed into ``views``,
        then marked ready; (bytes fetched, files reused)."""
        digest = manifest.digest
        self._clean_tmp()
        unlink(self._ready / digest)
        remove_entry(self._views / digest)  # half-built or half-removed: never used
        made: set[str] = set()
        self._fit(manifest, made, out)
        view = self._tmp / f"view.{digest}.build~{secrets.token_hex(6)}"
        fetched = reused = 0
        try:
            os.mkdir(view, 0o755)
            ahead = self._fetch_ahead(manifest, fetch, bar, made)
            fetched = sum(ahead.values())
            with Tree(view) as tree:
                for entry in manifest.files:
                    where, name = tree.dir(entry.path)
                    with locked(self._locks / _lock_name(entry.key), fcntl.LOCK_EX, drop=True):
                        obj = self._object(entry.key, made)
                        if reusable(obj, entry.size, discard=True):
                            if entry.key not in ahead:
                                reused += 1
                                bar.add(entry.size)
                        else:  # dropped since by another stage's room-making: fetched again
                            fetched += self._download(entry, fetch, obj, bar)
                        link(obj, where, name)
            os.rename(view, self._views / digest)  # the top one still writable: its ".." changes
            os.chmod(self._views / digest, 0o555)
            fsync_dir(self._views)
            touch(self._ready / digest)
            fsync_dir(self._ready)
        except BaseException as exc:
            remove_entry(view)
            failure = _failure(f"dataset version {digest[:12]}", exc, self.root)
            if isinstance(exc, OSError) and failure is not None:
                raise failure from exc
            raise
        return fetched, reused

    def _fetch_ahead(
        self, manifest: Manifest, fetch: Fetch, bar: _Progress, made: set[str]
    ) -> dict[str, int]:
        """The objects the version lacks, fetched :data:`FETCHERS` at a time (each under its
        own lock, as the view's build takes it), before the view is built in path order: a
        store's latency overlaps; the bytes fetched, by object."""
        missing: dict[str, FileEntry] = {}
        for entry in manifest.files:
            if entry.key not in missing and not reusable(self._object(entry.key, made), entry.size):
                missing[entry.key] = entry
        if not missing:
            return {}

        def one(entry: FileEntry) -> int | None:
            with locked(self._locks / _lock_name(entry.key), fcntl.LOCK_EX, drop=True):
                obj = self._object(entry.key, made)
                if reusable(obj, entry.size, discard=True):
                    return None  # another process fetched it meanwhile
                return self._download(entry, fetch, obj, bar)

        fetched: dict[str, int] = {}
        with ThreadPoolExecutor(min(FETCHERS, len(missing))) as pool:
            futures = {pool.submit(one, e): key for key, e in missing.items()}
            try:
                for future in as_completed(futures):
                    got = future.result()
                    if got is not None:
                        fetched[futures[future]] = got
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return fetched

    def _download(self, entry: FileEntry, fetch: Fetch, obj: Path, bar: _Progress) -> int:
        """:meth:`_fetch`, tried again after each of :data:`RETRY_DELAYS` while it fails
        transiently."""
        tries = 0
        counted = [0]  # this try's bytes

        def add(n: int) -> None:
            counted[0] += n
            bar.add(n)

        while True:
            tries += 1
            counted[0] = 0
            try:
                return self._fetch(entry, fetch, obj, add)
            except StagingError as exc:
                if not exc.transient:
                    raise
                if tries > len(RETRY_DELAYS):
                    raise StagingError(f"{exc} (tried {tries} times)", transient=True) from exc
                bar.add(-counted[0])  # this try's bytes: fetched again
                time.sleep(RETRY_DELAYS[tries - 1])

    def _fetch(self, entry: FileEntry, fetch: Fetch, obj: Path, add: Callable[[int], None]) -> int:
        """One download into ``.tmp`` (at most ``size + 1`` bytes read), hashed while written,
        synced, checked, made read-only and published at ``obj``; its size."""
        tmp = self._tmp / f"{_lock_name(entry.key)}~{secrets.token_hex(6)}"
        hasher = hashlib.new(entry.algorithm, usedforsecurity=False)
        size = 0
        try:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                with os.fdopen(os.open(tmp, flags, 0o600), "wb") as sink, fetch(entry) as stream:
                    while size <= entry.size:
                        chunk = stream.read(min(CHUNK, entry.size + 1 - size))
                        if not chunk:
                            break
                        sink.write(chunk)
                        hasher.update(chunk)
                        size += len(chunk)
                        add(len(chunk))
                    sink.flush()
                    os.fsync(sink.fileno())
                    os.fchmod(sink.fileno(), 0o444)
            except Exception as exc:
                failure = _failure(f"dataset file {entry.path!r}", exc, self.root)
                if failure is None:
                    raise
                raise failure from exc
            changed = f"dataset file {entry.path!r} changed since it was registered"
            if size != entry.size:
                found = f"over {entry.size}" if size > entry.size else str(size)
                raise StagingError(f"{changed} (size {found}, registered {entry.size})")
            if hasher.hexdigest() != entry.digest:
                raise StagingError(
                    f"{changed} (its {entry.algorithm} digest differs from the registered one)"
                )
            os.rename(tmp, obj)
        finally:
            unlink(tmp)
        return size

    def _fit(self, manifest: Manifest, made: set[str], out: Callable[[str], None] | None) -> None:
        """Before downloading: make room for what the cache lacks of ``manifest``."""
        if not self.max_bytes:
            return
        sizes, limit = {e.key: e.size for e in manifest.files}, self.max_bytes
        lack = sum(n for key, n in sizes.items() if not reusable(self._object(key, made), n))
        if self.total_bytes() + lack <= limit:
            return
        removed, total = self._prune(max(0, limit - lack), set(sizes))
        say, name, need = out or (lambda _line: None), manifest.digest[:12], sum(sizes.values())
        for v in removed:
            say(f"trainhouse: removed dataset version {v.digest[:12]} ({v.size} bytes, least "
                "recently used) from the node's dataset cache")  # fmt: skip
        if total + lack > limit and need > limit:
            say(f"trainhouse: dataset version {name} is {need} bytes, over the node's dataset "
                f"cache limit of {limit} bytes: staging it anyway")  # fmt: skip
        elif total + lack > limit:
            say(f"trainhouse: the node's dataset cache stays over its limit of {limit} bytes "
                f"(versions in use): staging dataset version {name} anyway")  # fmt: skip

    def _clean_tmp(self) -> None:
        """Remove what killed processes left in ``.tmp``: an entry whose lock is free, one
        naming no lock past :data:`STALE_SECONDS`."""
        with contextlib.suppress(OSError), os.scandir(self._tmp) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    lock, tilde, _ = entry.name.partition("~")
                    if tilde and lock == "trash":
                        remove_entry(Path(entry.path))
                    elif tilde and _TMP_LOCK.fullmatch(lock):
                        with locked(self._locks / lock, _TRY, drop=True) as fd:
                            if fd is not None:
                                remove_entry(Path(entry.path))
                    elif time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                        remove_entry(Path(entry.path))

    # -- what is in the cache, and removal

    def _scan_objects(self) -> dict[int, tuple[Path, str, int]]:
        """Every object by inode: (path, key, size)."""
        found: dict[int, tuple[Path, str, int]] = {}
        for algorithm in entries(self._objects, dirs=True):
            for shard in entries(Path(algorithm.path), dirs=True):
                for entry in entries(Path(shard.path), dirs=False):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
                        key = f"{algorithm.name}:{entry.name}"
                        found[st.st_ino] = (Path(entry.path), key, size)
        return found

    def _scan_views(self) -> list[tuple[CachedView, set[int]]]:
        """Every ready view with the inodes of its files, least recently used first."""
        found = []
        for entry in entries(self._views, dirs=True):
            digest = entry.name
            if not self.is_ready(digest):
                continue
            inodes: dict[int, int] = {}
            for path, _dirs, files in os.walk(entry.path):
                for name in files:
                    with contextlib.suppress(OSError):
                        st = os.lstat(os.path.join(path, name))
                        inodes[st.st_ino] = st.st_size
            used = mtime(self._used / digest) or mtime(self._ready / digest)
            with locked(self._locks / f"view.{digest}.use", _TRY) as fd:
                view = CachedView(digest, sum(inodes.values()), used, fd is None)
            found.append((view, set(inodes)))
        return sorted(found, key=lambda f: f[0].last_used)

    def _prune(self, max_bytes: int, keep: set[str]) -> tuple[list[CachedView], int]:
        """:meth:`prune`, never dropping an object whose key is in ``keep``; (the versions
        removed, the bytes left)."""
        if not self.root.is_dir():
            return [], 0
        self._layout()
        objects = self._scan_objects()
        total = sum(size for _path, _key, size in objects.values())
        if total <= max_bytes:
            return [], total
        for entry in entries(self._views, dirs=False):
            if not self.is_ready(entry.name):  # left by a killed builder
                self._remove_view(entry.name)
        total -= self._drop(objects, list(objects), keep)
        removed = []
        for view, inodes in self._scan_views():
            if total <= max_bytes:
                break
            if view.in_use or not self._remove_view(view.digest):
                continue
            removed.append(view)
            total -= self._drop(objects, inodes, keep)
        return removed, total

    def _drop(self, objects: dict[int, tuple[Path, str, int]], inodes: Iterable[int],
              keep: set[str]) -> int:  # fmt: skip
        """Remove the objects of ``inodes`` no view links (``st_nlink`` 1); the bytes freed."""
        freed = 0
        for inode in [i for i in inodes if i in objects and objects[i][1] not in keep]:
            path, key, size = objects[inode]
            with locked(self._locks / _lock_name(key), _TRY, drop=True) as fd:
                if fd is None:  # being fetched or linked
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(path)
                    if st.st_ino == inode and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                        continue
                    remove_entry(path)
                del objects[inode]
                freed += size
        return freed

    def _remove_view(self, digest: str) -> bool:
        """Remove a view no stage holds (its use lock, exclusive, not waited for); its marker
        first, then the tree moved into ``.tmp`` and deleted."""
        with locked(self._locks / f"view.{digest}.use", _TRY, drop=True) as fd:
            if fd is None:
                return False
            unlink(self._ready / digest)
            view = self._views / digest
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(view).st_mode):
                    os.chmod(view, 0o755)
                    trash = self._tmp / f"trash~{secrets.token_hex(6)}"
                    os.rename(view, trash)
                    view = trash
            remove_entry(view)
            unlink(self._used / digest)
            return True


def _lock_name(key: str) -> str:
    return key.replace(":", ".")


def _failure(where: str, exc: BaseException, root: Path) -> StagingError | None:
    """What a failure says; None for an exception of no known kind (raised as it is)."""
    if isinstance(exc, StagingError):
        return StagingError(f"{where}: {exc}", transient=exc.transient)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        cause = f"{type(exc).__name__} {exc}".strip()
        return StagingError(f"{where}: could not be fetched ({cause})", transient=True)
    if isinstance(exc, FileNotFoundError):
        return StagingError(f"{where} is missing from its source ({exc})")
    if isinstance(exc, PermissionError):
        return StagingError(f"{where}: permission refused ({exc})")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StagingError(f"{where}: no space left on the node's dataset cache ({root})")
    return StagingError(f"{where}: {exc}") if isinstance(exc, OSError) else None
