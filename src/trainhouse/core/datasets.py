"""Datasets, pure: names and references (``digits@2``), a version's manifest (every file's
relative path, size and digest) and its own digest, the pins a job resolves at submit, and
what a node's supervisor is handed to stage them (``TRAINHOUSE_DATASETS``).

A version is identified by its manifest's digest: the sha256 of the manifest's canonical text,
one line per file ordered by path. A file's digest is ``ALGORITHM:HEX``: ``sha256`` when the
server hashed the file while reading it once at registration, ``md5`` when the store gave a
content checksum (an S3 ETag of a single-part upload, GCS's ``md5Hash``). The node cache is
addressed by it, so two versions that share a file share its bytes.

Everything here is checked as hostile input: a manifest a request or a store gives, a path
with ``..``, an absolute one, control characters, a million files.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainhouse.core.errors import DatasetError

__all__ = [
    "ENV_PREFIX",
    "MAX_FILES",
    "STAGE_VAR",
    "FileEntry",
    "Manifest",
    "Pin",
    "StageRequest",
    "check_key",
    "check_name",
    "check_path",
    "env_var",
    "parse_ref",
]

#: the rank's variable of a dataset pinned under ``key``: ``TRAINHOUSE_DATASET_<KEY>``
ENV_PREFIX = "TRAINHOUSE_DATASET_"
#: what the supervisor is handed (JSON, :class:`StageRequest`); popped before torchrun starts
STAGE_VAR = "TRAINHOUSE_DATASETS"
#: the most files a version may have (a manifest of a million files is refused)
MAX_FILES = 200_000
MAX_PATH_BYTES = 1024  # one file's relative path, UTF-8
MAX_COMPONENT_BYTES = 255
#: the most datasets one job may pin
MAX_PINS = 32
ALGORITHMS = ("sha256", "md5")
_HEX_LENGTH = {"sha256": 64, "md5": 32}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_name(name: str) -> str:
    """A dataset's name: 1 to 64 letters, digits, ``.``, ``_`` or ``-``, starting with a letter
    or digit."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise DatasetError(
            f"dataset name {name!r} is invalid: use 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_key(key: str) -> str:
    """A key under ``datasets:`` (``train``): it names the rank's variable, so a lower-case
    identifier of at most 32 characters."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise DatasetError(
            f"datasets key {key!r} is invalid: use a lower-case letter then up to 31 lower-case "
            "letters, digits or '_' (it names TRAINHOUSE_DATASET_<KEY>)"
        )
    return key


def env_var(key: str) -> str:
    return ENV_PREFIX + check_key(key).upper()


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` (the latest version, resolved at submit) or ``NAME@N``."""
    if not isinstance(ref, str):
        raise DatasetError(f"a dataset reference is NAME or NAME@VERSION, not {ref!r}")
    name, at, version = ref.partition("@")
    check_name(name)
    if not at:
        return name, None
    if not version.isdigit() or not 0 < int(version) < 2**31:
        raise DatasetError(
            f"dataset reference {ref!r}: the version after '@' is a number from 1, not {version!r}"
        )
    return name, int(version)


def check_path(path: str) -> str:
    """A file's path inside a version: relative, ``/``-separated, no ``.`` or ``..``
    component, no empty one, no control character or backslash, bounded. The node writes
    nothing outside the version's own directory because of this check."""
    if not isinstance(path, str) or not path:
        raise DatasetError("a dataset file's path is empty")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise DatasetError(f"a dataset file's path is over {MAX_PATH_BYTES} bytes: {path[:80]!r}")
    if _CONTROL.search(path) or "\\" in path:
        raise DatasetError(f"dataset file path {path!r} holds a control character or a backslash")
    if path.startswith("/"):
        raise DatasetError(f"dataset file path {path!r} is absolute")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise DatasetError(f"dataset file path {path!r} has an empty, '.' or '..' component")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise DatasetError(f"dataset file path {path!r} has a component over 255 bytes")
    return path


@dataclass(frozen=True)
class FileEntry:
    """One file of a version: where it sits in the version, its size, its content digest."""

    path: str
    size: int
    algorithm: str  # "sha256" (hashed by the server) or "md5" (the store's checksum)
    digest: str  # lower-case hex

    def __post_init__(self) -> None:
        check_path(self.path)
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise DatasetError(f"dataset file {self.path!r}: size {self.size!r} is invalid")
        if self.algorithm not in ALGORITHMS:
            raise DatasetError(
                f"dataset file {self.path!r}: digest algorithm {self.algorithm!r} is not one of "
                f"{', '.join(ALGORITHMS)}"
            )
        if not isinstance(self.digest, str) or not re.fullmatch(
            rf"[0-9a-f]{{{_HEX_LENGTH[self.algorithm]}}}", self.digest
        ):
            raise DatasetError(f"dataset file {self.path!r}: digest {self.digest!r} is invalid")

    @property
    def key(self) -> str:
        """The node cache's address of the file's bytes: ``ALGORITHM:HEX``."""
        return f"{self.algorithm}:{self.digest}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "algorithm": self.algorithm,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, data: Any) -> FileEntry:
        if not isinstance(data, Mapping):
            raise DatasetError("a manifest's file is not an object")
        try:
            return cls(data["path"], data["size"], data["algorithm"], data["digest"])
        except KeyError as exc:
            raise DatasetError(f"a manifest's file has no {exc.args[0]!r}") from None


@dataclass(frozen=True)
class Manifest:
    """A version's files, ordered by path; its :attr:`digest` identifies the version."""

    files: tuple[FileEntry, ...]

    def __post_init__(self) -> None:
        if len(self.files) > MAX_FILES:
            raise DatasetError(
                f"a dataset version has {len(self.files)} files, over the limit of {MAX_FILES}: "
                "pack small files into shards (tar, parquet, webdataset)"
            )
        paths = [f.path for f in self.files]
        if paths != sorted(paths):
            object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda f: f.path)))
            paths.sort()
        seen: set[str] = set()
        dirs: set[str] = set()
        for path in paths:
            if path in seen:
                raise DatasetError(f"dataset file {path!r} is listed twice")
            seen.add(path)
            parts = path.split("/")
            dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        clash = seen & dirs
        if clash:
            raise DatasetError(f"dataset path {sorted(clash)[0]!r} is both a file and a directory")

    @classmethod
    def of(cls, files: Iterable[FileEntry]) -> Manifest:
        return cls(tuple(files))

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical text: ``PATH\\0SIZE\\0ALGORITHM:HEX\\n`` per file."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.path}\0{f.size}\0{f.key}\n".encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.files]

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        if not isinstance(data, list):
            raise DatasetError("a manifest is a list of files")
        if len(data) > MAX_FILES:
            raise DatasetError(f"a manifest of {len(data)} files is over the limit of {MAX_FILES}")
        return cls(tuple(FileEntry.from_json(item) for item in data))


@dataclass(frozen=True)
class Pin:
    """A dataset version a job reads under ``key``, resolved at submit and kept by the job
    (a restart, a resume read the same one)."""

    key: str
    name: str
    version: int
    digest: str  # the manifest's

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "version": self.version, "digest": self.digest}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pin:
        return cls(str(data["key"]), str(data["name"]), int(data["version"]), str(data["digest"]))


@dataclass(frozen=True)
class StagedSource:
    """Where a node reads one pinned version's files: ``url`` with ``storage_options`` (fsspec;
    the credentials are the node's own environment's), or, with ``url`` None, the server's
    dataset storage through the REST API with the job's credential. ``kind`` "model": a model
    version the job reads as an input (``inputs:``), through the job's own routes
    (``/jobs/<id>/inputs/<key>``), its rank variable ``TRAINHOUSE_INPUT_<KEY>``."""

    pin: Pin
    url: str | None = None
    storage_options: dict[str, str] = field(default_factory=dict)
    kind: str = "dataset"  # "dataset" | "model"

    def to_json(self) -> dict[str, Any]:
        return {
            "pin": self.pin.to_json(),
            "url": self.url,
            "storage_options": dict(self.storage_options),
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StagedSource:
        options = data.get("storage_options") or {}
        return cls(
            Pin.from_json(data["pin"]),
            None if data.get("url") is None else str(data["url"]),
            {str(k): str(v) for k, v in dict(options).items()},
            "model" if data.get("kind") == "model" else "dataset",
        )


@dataclass(frozen=True)
class StageRequest:
    """What a node's supervisor stages before torchrun starts (``TRAINHOUSE_DATASETS``): every
    pinned version, into the node's cache at ``cache`` (bounded by ``cache_bytes``)."""

    sources: tuple[StagedSource, ...]
    cache: str = ""
    cache_bytes: int = 0

    def with_cache(self, cache: str, cache_bytes: int) -> StageRequest:
        return StageRequest(self.sources, cache, cache_bytes)

    def to_json(self) -> str:
        return json.dumps(
            {
                "sources": [s.to_json() for s in self.sources],
                "cache": self.cache,
                "cache_bytes": self.cache_bytes,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> StageRequest:
        data = json.loads(text)
        return cls(
            tuple(StagedSource.from_json(s) for s in data["sources"]),
            str(data.get("cache", "")),
            int(data.get("cache_bytes", 0)),
        )


#: a supervisor's exit code when a pinned version cannot be staged for good (a file changed,
#: is missing, a permission is refused, the disk is full): the attempt fails with the reason
STAGING_FAILED_CODE = 79
#: ... when it may pass (a timeout, a 5xx after retries): tried again as an infrastructure failure
STAGING_RETRY_CODE = 75
#: the launcher log's lines about staging
STAGING_LINE = "trainhouse: staging"
STAGING_FAILED_LINE = "trainhouse: a dataset could not be staged"


def staging_phase(launcher_log: str) -> str | None:
    """What an attempt's launcher log (its part for the attempt) says about staging its
    datasets: the last word of it ("staging digits@2: 41% (120 of 290 MB)", "staging digits@2:
    ready in 3.10 s ..."), "staging failed: <why>", or None when it stages nothing."""
    last = None
    for line in launcher_log.splitlines():
        if STAGING_FAILED_LINE in line:
            return "staging failed: " + line.split(STAGING_FAILED_LINE, 1)[1].lstrip(": ")[:300]
        if STAGING_LINE in line:
            last = line
    if last is None:
        return None
    return last[last.index(STAGING_LINE) + len("trainhouse: ") :][:300]
