"""The Python client's dataset calls (a part of :class:`trainhouse.client.Client`): adding a
version from a URL or a local directory (packed and uploaded), listing, showing, a manifest,
removing.

A local directory is packed into a temporary ``.tar.gz`` streamed to the server (never held in
memory). Only regular files and directories are packed: a symbolic link, a FIFO, a socket or a
device inside it is refused by name before anything is sent.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainhouse.client.base import ClientBase
from trainhouse.client.records import (
    DataCache,
    Dataset,
    DatasetAdded,
    DatasetDetail,
    DatasetList,
    DatasetVersion,
    Manifest,
)
from trainhouse.core.errors import ClientError

__all__ = ["DatasetCalls", "pack_dataset"]

UPLOAD_TIMEOUT = 3600.0  # seconds: the server hashes what it receives before it answers


def _seg(value: str | int) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


def _regular_files(root: Path) -> list[tuple[Path, str]]:
    """(path, name in the archive) of every file under ``root``, refusing anything that is not
    a regular file or a directory (never followed)."""
    found: list[tuple[Path, str]] = []
    stack = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                name = f"{prefix}{entry.name}"
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    stack.append((Path(entry.path), name + "/"))
                elif stat.S_ISREG(mode):
                    found.append((Path(entry.path), name))
                else:
                    kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                    raise ClientError(
                        f"{entry.path} is {kind}: a dataset holds regular files only "
                        "(copy what it points to, or leave it out)",
                        status=422,
                        code="dataset_error",
                    )
    return found


def pack_dataset(source: Path, out: Path) -> tuple[int, int]:
    """Pack a directory (or one file) into ``out`` (.tar.gz, fast compression); (files, bytes)."""
    source = Path(source)
    st = source.lstat()
    if stat.S_ISREG(st.st_mode):
        files = [(source, source.name)]
    elif stat.S_ISDIR(st.st_mode):
        files = _regular_files(source)
    else:
        raise ClientError(f"{source} is not a directory or a regular file", status=422)
    total = 0
    with tarfile.open(out, mode="w:gz", compresslevel=1) as tar:
        for path, name in files:
            with path.open("rb") as fh:
                info = tar.gettarinfo(fileobj=fh, arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                total += info.size
                tar.addfile(info, fh)
    return len(files), total


class DatasetCalls(ClientBase):
    """The calls about datasets; :class:`~trainhouse.client.Client` has them."""

    def datasets(self) -> list[Dataset]:
        page: DatasetList = self._json("GET", "/datasets")
        return page["datasets"]

    def dataset(self, name: str) -> DatasetDetail:
        """A dataset, its versions (oldest first) and the jobs that pinned it."""
        result: DatasetDetail = self._json("GET", f"/datasets/{_seg(name)}")
        return result

    def dataset_version(self, name: str, version: int | None = None) -> DatasetVersion:
        """``name@version`` (the newest without one), with the jobs that pinned it."""
        if version is None:
            detail = self.dataset(name)
            if not detail["versions"]:
                raise ClientError(f"dataset {name!r} has no versions", status=404)
            version = detail["versions"][-1]["version"]
        found: DatasetVersion = self._json("GET", f"/datasets/{_seg(name)}/versions/{int(version)}")
        return found

    def dataset_manifest(self, name: str, version: int) -> Manifest:
        """Every file of a version: path, size, digest."""
        found: Manifest = self._json(
            "GET", f"/datasets/{_seg(name)}/versions/{int(version)}/manifest"
        )
        return found

    def add_dataset(
        self,
        name: str,
        source: str | os.PathLike[str],
        *,
        storage_options: dict[str, str] | None = None,
        description: str | None = None,
        copy: bool = False,
        on_packed: Callable[[int, int], Any] | None = None,
    ) -> DatasetAdded:
        """A new version of ``name``: ``source`` is a URL fsspec reads (``s3://bucket/prefix``
        with ``storage_options``; ``copy`` keeps a copy on the server) or a local directory or
        file, packed and uploaded (``on_packed(files, bytes)`` once it is packed). Content the
        name already has gives that version (``new`` false)."""
        text = os.fspath(source)
        if "://" in text:
            body: dict[str, Any] = {
                "source": text,
                "storage_options": storage_options or {},
                "description": description,
                "copy": copy,
            }
            added: DatasetAdded = self._json(
                "POST", f"/datasets/{_seg(name)}/versions", json=body, timeout=UPLOAD_TIMEOUT
            )
            return added
        if storage_options or copy:
            raise ClientError(
                "--storage-option and --copy are for a URL source; a local directory is "
                "uploaded to the server's dataset storage",
                status=422,
            )
        path = Path(text).expanduser()
        if not path.exists():
            raise ClientError(
                f"{path} does not exist (a dataset source is a path or a URL)", status=404
            )
        with tempfile.TemporaryDirectory(prefix="trainhouse-dataset-") as tmp:
            packed = Path(tmp) / "dataset.tar.gz"
            files, size = pack_dataset(path, packed)
            if on_packed is not None:
                on_packed(files, size)
            with packed.open("rb") as fh:
                added = self._json(
                    "POST",
                    f"/datasets/{_seg(name)}/upload",
                    files={"archive": ("dataset.tar.gz", fh, "application/gzip")},
                    data={"description": description} if description else None,
                    timeout=UPLOAD_TIMEOUT,
                )
        return added

    def dataset_cache(self) -> DataCache:
        """What the server machine's cache of staged dataset versions holds."""
        found: DataCache = self._json("GET", "/datacache")
        return found

    def remove_dataset(self, name: str, version: int) -> DatasetVersion:
        """Forget ``name@version``; refused (409, naming the job) while a queued or running job
        pins it."""
        gone: DatasetVersion = self._json(
            "DELETE", f"/datasets/{_seg(name)}/versions/{int(version)}"
        )
        return gone
