"""Where a dataset version's files come from: a URL fsspec understands, listed, hashed, read.

``trainhouse datasets add NAME SOURCE`` registers a version of ``s3://bucket/prefix``,
``gs://``, ``az://``, ``hdfs://``, one ``http(s)://host/file``, or ``file:///shared/dir`` under
one of the server's dataset roots. The server checks the URL and its storage options
(:mod:`~trainhouse.jobfs.sourcecheck`, re-exported here) and makes the manifest
(:func:`manifest_of`); a node's cache reads each file through :func:`open_file`. Credentials
never come with a request: each protocol's library reads them from the process's environment
(``AWS_*`` for S3), and an option that carries or selects one is refused.

A URL names a directory (every file under it, recursively, by relative path) or one file (one
entry, its basename). A file's digest is the store's content MD5 where it gives one, so
registering a bucket of terabytes reads nothing:

- S3: the ETag of a single-part upload (32 hex digits, no ``-``), unless the object is SSE-KMS
  or SSE-C encrypted: a ``HEAD`` of each such object says which, as no listing does;
- GCS: ``md5Hash`` (base64) as hex (a composite object has none);
- anything else (a multipart upload, Azure, HDFS, HTTP, a local file): none; the server
  hashes the file (sha256) while reading it once, and refuses it if it grows or shrinks.

What a store or a directory gives is hostile input: a key with ``..``, a link, FIFO or device
in a shared directory, a million objects (listings stop past the limit). A local source's own
directory is opened once; everything below it is walked with ``scandir`` and opened relative
to its parent's descriptor with ``O_NOFOLLOW``: no link is followed. An HTTP source (or an
``endpoint_url``) may not reach a loopback, link-local or private address unless the server
allows it (the cloud metadata endpoint); while the server reads one, each redirect hop and
DNS answer is checked too. Standard library at import; fsspec (and aiohttp for that HTTP
guard) when a URL needs it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import io
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Self, cast
from urllib.parse import quote, unquote, urlsplit

from trainhouse.core.datasets import MAX_FILES, FileEntry, Manifest, check_path
from trainhouse.core.errors import DatasetError, StagingError
from trainhouse.jobfs.sourcecheck import (
    OPTIONS,
    PROTOCOLS,
    check_options,
    check_source,
    guarded_client,
    local_path,
    option_value,
    protocol_of,
    within,
)

__all__ = [
    "OPTIONS",
    "PROTOCOLS",
    "SourceFile",
    "check_options",
    "check_source",
    "list_source",
    "manifest_of",
    "manifest_of_tree",
    "open_file",
]

_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
             "hdfs": "pyarrow"}  # fmt: skip
CHUNK = 1 << 20
_MD5_ETAG = re.compile(r'^"?([0-9a-fA-F]{32})"?$')
_HEADS_AT_ONCE, _HEADS_PER_BATCH = 32, 1024
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = _FILE_FLAGS | os.O_DIRECTORY
# matched by class name anywhere in an error's chain: botocore's, aiohttp's, fsspec's
_TRANSIENT = {"TimeoutError", "ConnectionError", "ClientConnectionError", "ClientPayloadError",
              "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
              "FSTimeoutError", "IncompleteReadError", "ResponseStreamingError"}  # fmt: skip
_TRANSIENT_ERRNOS = {errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED, errno.EPIPE,
                     errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                     errno.EREMOTEIO}  # fmt: skip

_CHANGED = "it is being written; register the version once it is complete"
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SourceFile:
    """A file of a source: its path below the URL (``/``-separated, as
    :func:`~trainhouse.core.datasets.check_path` accepts), its size, and the store's content
    checksum ``(algorithm, hex)`` when it gives one (``("md5", ...)``)."""

    path: str
    size: int
    checksum: tuple[str, str] | None = None


# -- sources ----------------------------------------------------------------------------------


class _Source:
    """One source, resolved once: its files listed, each opened by relative path."""

    single: str | None = None  # the basename, for a source that is one file

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def files(self, max_files: int) -> list[SourceFile]:
        raise NotImplementedError

    def open(self, rel: str, size: int | None = None) -> BinaryIO:
        """``rel`` open for reading; ``size``, when the manifest knows it, spares a store the
        request for it (a HEAD per S3 object)."""
        raise NotImplementedError

    def entry(self, rel: str, size: Any, checksum: tuple[str, str] | None = None) -> SourceFile:
        try:
            check_path(rel)
        except DatasetError as exc:
            raise DatasetError(
                f"{self.url}: {rel[:200]!r} cannot be a dataset file: {exc}"
            ) from None
        if not isinstance(size, int) or size < 0:
            raise DatasetError(f"{self.url}: no size is known for {rel!r}")
        return SourceFile(rel, size, checksum)

    def full(self, count: int, max_files: int) -> None:
        if count > max_files:
            raise DatasetError(
                f"{self.url} holds more than {max_files} files, a dataset version's limit: pack "
                "small files into shards (tar, parquet, webdataset)"
            )


class _Local(_Source):
    """A local directory or file: its directory opened once (links followed: the server
    resolved it; with ``roots``, where the descriptor lies is checked again), everything below
    it opened relative to its parent with ``O_NOFOLLOW``."""

    def __init__(self, url: str, roots: Sequence[Path] | None = None) -> None:
        super().__init__(url)
        path = local_path(url)
        if not stat.S_ISDIR(os.stat(path).st_mode):
            path, self.single = os.path.split(path.rstrip("/"))
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with contextlib.suppress(FileNotFoundError):  # no /proc: check_source's check stands
            if roots is not None and not within(os.readlink(f"/proc/self/fd/{self.fd}"), roots):
                self.__exit__()
                raise DatasetError(f"{url} moved outside the dataset roots")

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def files(self, max_files: int) -> list[SourceFile]:
        if self.single is not None:
            st = os.stat(self.single, dir_fd=self.fd, follow_symlinks=False)
            return [self._regular(self.single, st)]
        found: list[SourceFile] = []
        self._walk(self.fd, "", found, max_files)
        return sorted(found, key=lambda f: f.path)

    def _walk(self, dir_fd: int, prefix: str, found: list[SourceFile], max_files: int) -> None:
        with os.scandir(dir_fd) as entries:  # counted as read: a million files stop early
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    found.append(self._regular(prefix + entry.name, st))
                    self.full(len(found), max_files)
                    continue
                fd = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    self._walk(fd, f"{prefix}{entry.name}/", found, max_files)
                finally:
                    os.close(fd)

    def _regular(self, rel: str, st: os.stat_result) -> SourceFile:
        if not stat.S_ISREG(st.st_mode):
            raise DatasetError(
                f"{self.url}: {rel!r} is a {_kind(st.st_mode)}: only regular files and "
                "directories are read, and no link is followed"
            )
        return self.entry(rel, st.st_size)

    def open(self, rel: str, size: int | None = None) -> BinaryIO:
        if self.single is not None and rel != self.single:
            raise FileNotFoundError(errno.ENOENT, "not in this source", rel)
        *dirs, name = check_path(rel).split("/")
        opened: list[int] = []
        try:
            for part in dirs:
                opened.append(os.open(part, _DIR_FLAGS, dir_fd=opened[-1] if opened else self.fd))
            at = opened[-1] if opened else self.fd
            self._regular(rel, st := os.stat(name, dir_fd=at, follow_symlinks=False))
            fd = os.open(name, _FILE_FLAGS, dir_fd=at)
        finally:
            for each in opened:
                os.close(each)
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise StagingError(f"{self.url}: {rel!r} was replaced while it was opened")
        return open(fd, "rb")


class _Fsspec(_Source):
    """A source on an fsspec filesystem, whose listings are never cached (a new version of the
    same prefix is listed afresh)."""

    def __init__(self, url: str, options: Mapping[str, str], *, guard: bool = False) -> None:
        super().__init__(url)
        self.protocol = protocol_of(url)
        self.fs, path = _filesystem(url, options, guard=guard)
        self.path = str(path).rstrip("/")
        if self.protocol in ("http", "https"):
            self.single = posixpath.basename(unquote(urlsplit(url).path))
            if not self.single:
                raise DatasetError(f"an http(s) source names one file, not {url[:200]!r}")

    def files(self, max_files: int) -> list[SourceFile]:
        if self.single is not None:  # HTTP
            return [self.entry(self.single, self.fs.info(self.url).get("size"))]
        if self.protocol == "s3":
            return self._s3_files(max_files)
        info = self.fs.info(self.path)
        if info.get("type") != "directory":
            return [self._file(posixpath.basename(self.path), info)]
        found: list[SourceFile] = []
        for _, _, files in self.fs.walk(self.path, detail=True):  # a directory at a time
            for info in files.values():
                name = str(type(self.fs)._stripprotocol_of(info["name"]))
                if not name.startswith(self.path + "/"):
                    raise DatasetError(f"{self.url}: the store lists {name!r} under it")
                found.append(self._file(name.removeprefix(self.path + "/"), info))
                self.full(len(found), max_files)
        return sorted(found, key=lambda f: f.path)

    def _file(self, rel: str, info: Mapping[str, Any]) -> SourceFile:
        if info.get("type") != "file":
            raise DatasetError(f"{self.url}: {rel!r} is a {info.get('type')}, not a file")
        try:
            md5 = base64.b64decode(str(info["md5Hash"]), validate=True)  # GCS
        except (KeyError, ValueError):
            md5 = b""
        return self.entry(rel, info.get("size"), ("md5", md5.hex()) if len(md5) == 16 else None)

    def _s3_files(self, max_files: int) -> list[SourceFile]:
        bucket, key, _ = self.fs.split_path(self.path)
        prefix = f"{key}/" if key else ""
        found: list[tuple[SourceFile, str]] = []
        page: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:  # a page at a time: a million keys are not listed past the limit
            answer = self.fs.call_s3("list_objects_v2", **page)
            for obj in answer.get("Contents", []):
                if not (obj["Key"].endswith("/") and obj["Size"] == 0):  # a "folder" marker
                    rel = obj["Key"][len(prefix) :]
                    found.append((self.entry(rel, obj["Size"]), obj["ETag"]))
                    self.full(len(found), max_files)
            if not answer.get("IsTruncated"):
                break
            page["ContinuationToken"] = answer["NextContinuationToken"]
        if not found and key and not self.url.endswith("/"):
            head = self.fs.call_s3("head_object", Bucket=bucket, Key=key)
            return [self.entry(posixpath.basename(key), head["ContentLength"], _s3_md5(head))]
        if not found:
            raise DatasetError(f"{self.url}: no object under this prefix")
        heads = self._heads(bucket, [prefix + f.path for f, e in found if _MD5_ETAG.match(e)])
        return [SourceFile(f.path, f.size, _s3_md5(heads.get(prefix + f.path))) for f, _ in found]

    def _heads(self, bucket: str, keys: list[str]) -> dict[str, Any]:
        """``HEAD`` of each key, a few at once: whether it is SSE-KMS or SSE-C encrypted."""
        from fsspec.asyn import sync

        async def batch(keys: list[str]) -> list[Any]:
            limit = asyncio.Semaphore(_HEADS_AT_ONCE)

            async def head(key: str) -> Any:
                async with limit:
                    return await self.fs._call_s3("head_object", Bucket=bucket, Key=key)

            return await asyncio.gather(*map(head, keys), return_exceptions=True)

        out: dict[str, Any] = {}
        for start in range(0, len(keys), _HEADS_PER_BATCH):
            chunk = keys[start : start + _HEADS_PER_BATCH]
            out.update(zip(chunk, sync(self.fs.loop, batch, chunk), strict=True))
        return out

    def open(self, rel: str, size: int | None = None) -> BinaryIO:
        check_path(rel)
        if self.protocol in ("http", "https"):
            if rel != self.single:
                raise FileNotFoundError(errno.ENOENT, "not in this source", rel)
            # one streamed GET; a size given, fsspec sends no HEAD first
            return cast(BinaryIO, self.fs.open(self.url, "rb", block_size=0, size=-1))
        known = {"size": size} if size is not None and self.protocol in ("s3", "gs", "gcs") else {}
        try:
            # past the registered size a read gives nothing: a grown object's registered bytes
            # are still checked against the digest, a shrunk one ends short
            return cast(BinaryIO, self.fs.open(f"{self.path}/{rel}", "rb", **known))
        except FileNotFoundError:
            if rel != posixpath.basename(self.path):
                raise
            return cast(BinaryIO, self.fs.open(self.path, "rb"))  # a one-object source


def _s3_md5(head: Any) -> tuple[str, str] | None:
    """The MD5 an S3 ``HEAD`` gives: the ETag, unless multipart or SSE-KMS/SSE-C (or no
    answer: SSE-C refuses a HEAD without its key)."""
    if not isinstance(head, Mapping) or head.get("SSECustomerAlgorithm"):
        return None
    if str(head.get("ServerSideEncryption", "")).startswith("aws:kms"):
        return None
    found = _MD5_ETAG.match(str(head.get("ETag", "")))
    return ("md5", found.group(1).lower()) if found else None


def _filesystem(url: str, options: Mapping[str, str], *, guard: bool = False) -> tuple[Any, str]:
    """fsspec's filesystem and path for ``url`` (the URL's own settings too: HDFS's host)."""
    from fsspec.core import url_to_fs

    protocol = protocol_of(url)
    kwargs: dict[str, Any] = {key: option_value(key, value) for key, value in options.items()}
    if guard and protocol in ("http", "https"):
        kwargs["get_client"] = guarded_client
    try:
        return cast(tuple[Any, str], url_to_fs(url, use_listings_cache=False, **kwargs))
    except ImportError:
        package = _PACKAGES.get(protocol, "aiohttp")
        raise DatasetError(f"{protocol}:// sources need {package} installed") from None


def _source(url: str, options: Mapping[str, str], **how: Any) -> _Source:
    if protocol_of(url) == "file":
        return _Local(url, how.get("roots"))
    return _Fsspec(url, options, guard=how.get("guard", False))


def _kind(mode: int) -> str:
    kinds = {stat.S_ISLNK: "symbolic link", stat.S_ISFIFO: "FIFO", stat.S_ISSOCK: "socket",
             stat.S_ISCHR: "character device", stat.S_ISBLK: "block device"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "special file")


# -- errors -----------------------------------------------------------------------------------


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)  # botocore's ClientError
    if isinstance(response, Mapping):
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    status = getattr(exc, "status", None)  # aiohttp's ClientResponseError
    return status if isinstance(status, int) else 0


def _is_transient(exc: BaseException) -> bool:
    """A timeout, a connection error, a 5xx or a 429 anywhere in ``exc``'s chain."""
    for each in _chain(exc):
        if {c.__name__ for c in type(each).__mro__} & _TRANSIENT:
            return True
        if _status(each) >= 500 or _status(each) == 429:
            return True
        if isinstance(each, OSError) and each.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def _error(exc: BaseException, where: str, staging: bool) -> DatasetError:
    """``exc`` (ours, or a library's) as a :class:`DatasetError` (listing, registering) or a
    :class:`StagingError` (reading a file)."""
    ours = next((e for e in _chain(exc) if isinstance(e, DatasetError)), None)
    if ours is not None:  # maybe under a library's: the guarded HTTP client's refusal
        return StagingError(str(ours)) if staging and type(ours) is DatasetError else ours
    status = _status(exc)
    transient = _is_transient(exc)
    if transient:
        message = f"{where}: {type(exc).__name__}: {exc} (may pass: try again)"
    elif isinstance(exc, FileNotFoundError) or status in (404, 410):
        message = f"{where} is missing (deleted or renamed?)"
    elif isinstance(exc, PermissionError) or status in (401, 403):
        message = f"{where}: permission refused ({exc})"
    elif isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENOTDIR):
        message = f"{where}: a symbolic link on the way is not followed ({exc})"
    else:
        message = f"{where}: {type(exc).__name__}: {exc}"
    return StagingError(message, transient=transient) if staging else DatasetError(message)


class _Reader(io.RawIOBase):
    """A source's open file whose read errors are :class:`StagingError`s (a connection lost
    in the middle of an object is transient)."""

    def __init__(self, raw: BinaryIO, where: str) -> None:
        self._raw, self._where = raw, where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any, /) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._raw.read(len(view))
        except Exception as exc:
            raise _error(exc, self._where, True) from exc
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


# -- the API ----------------------------------------------------------------------------------


def list_source(
    url: str, storage_options: Mapping[str, str], *, max_files: int = MAX_FILES
) -> list[SourceFile]:
    """The source's files, sorted by path: every file under a directory or prefix, or the one
    file ``url`` names (its basename), each with the store's checksum where it gives one.
    :class:`DatasetError` past ``max_files`` (the listing stops there), for a path
    :func:`~trainhouse.core.datasets.check_path` refuses, for a link, FIFO, socket or device in
    a local directory, or when nothing is there. The URL is not checked: :func:`check_source`."""
    try:
        with _source(url, storage_options) as src:
            return src.files(max_files)
    except Exception as exc:  # the libraries' own errors (botocore's, aiohttp's) too
        raise _error(exc, url, False) from exc


@contextlib.contextmanager
def open_file(
    url: str, storage_options: Mapping[str, str], rel: str, size: int | None = None
) -> Iterator[BinaryIO]:
    """The file ``rel`` of the source ``url`` (as :func:`list_source` names it) open for
    streaming reads; a local one reached through no link. Any error, opening or reading, is a
    :class:`StagingError`: missing, permission refused (not transient), a timeout, a connection
    error, an HTTP 5xx (``transient=True``). The node's cache fetches with it."""
    where = f"dataset file {rel!r} of {url}"
    try:
        with _source(url, storage_options) as src:
            reader = io.BufferedReader(_Reader(src.open(rel, size), where), CHUNK)
    except Exception as exc:
        raise _error(exc, where, True) from exc
    with reader:
        yield cast(BinaryIO, reader)


def manifest_of(
    url: str,
    storage_options: Mapping[str, str],
    *,
    progress: Progress | None = None,
    file_roots: Sequence[Path] = (),
    allow_private: bool = False,
) -> Manifest:
    """The manifest of the source ``url``, checked (:func:`check_source`,
    :func:`check_options`) and listed: a file with the store's checksum is not read (``md5``),
    every other one is read once and hashed (``sha256``); ``progress(done, total)`` is told
    the bytes hashed of those to hash after each chunk. A file that yields more or fewer
    bytes than listed is refused: it changed while the version was being registered."""
    url = check_source(url, file_roots=file_roots, allow_private=allow_private)
    options = check_options(url, storage_options, allow_private=allow_private)
    return _manifest(url, options, progress, roots=file_roots, guard=not allow_private)


def manifest_of_tree(directory: Path, *, progress: Progress | None = None) -> Manifest:
    """The manifest of a local directory (an uploaded dataset, unpacked): the sha256 of each
    regular file under it; a link, FIFO, socket or device in it is refused."""
    return _manifest("file://" + quote(os.path.abspath(directory)), {}, progress)


def _manifest(url: str, opts: Mapping[str, str], progress: Progress | None, **how: Any) -> Manifest:
    try:
        with _source(url, opts, **how) as src:
            files = src.files(MAX_FILES)
            total, done = sum(f.size for f in files if f.checksum is None), 0
            entries = []
            for f in files:
                if f.checksum is not None:
                    entries.append(FileEntry(f.path, f.size, *f.checksum))
                    continue
                where = f"dataset file {f.path!r} of {url}"
                try:
                    raw = src.open(f.path)
                except Exception as exc:
                    raise _error(exc, where, False) from exc
                with _Reader(raw, where) as reader:
                    h = hashlib.sha256()
                    for chunk in _exactly(reader, f, url):
                        h.update(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
                entries.append(FileEntry(f.path, f.size, "sha256", h.hexdigest()))
            return Manifest.of(entries)
    except Exception as exc:
        raise _error(exc, url, False) from exc


def _exactly(reader: _Reader, f: SourceFile, url: str) -> Iterator[bytes]:
    """The file's bytes in chunks, up to one byte past its listed size and no further."""
    n = 0
    while chunk := reader.read(min(CHUNK, f.size + 1 - n)):
        n += len(chunk)
        if n > f.size:
            raise DatasetError(
                f"{url}: {f.path!r} grew while it was read (listed at {f.size} bytes): {_CHANGED}"
            )
        yield chunk
    if n != f.size:
        raise DatasetError(
            f"{url}: {f.path!r} shrank while it was read ({n} of the {f.size} bytes listed): "
            + _CHANGED
        )
