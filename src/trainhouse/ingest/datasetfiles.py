"""The server's dataset storage: every version's manifest, and the files of versions the server
holds itself (an uploaded directory, or a remote source copied with ``--copy``).

::

    <storage>/manifests/<digest>.json            a version's manifest, named by its own sha256
    <storage>/objects/<algorithm>/<xx>/<hex>     a file's bytes, named by its content digest
    <storage>/tmp/                               uploads and copies being written

Files are content-addressed, so two versions (of any datasets) that share a file keep its bytes
once. Everything is written to ``tmp/`` first, verified, then renamed into place: a crash leaves
a stray temporary file, never a wrong object. A manifest read back is checked against its name.
Reads never follow a link (``O_NOFOLLOW``) and take regular files only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from trainhouse.core.datasets import MAX_FILES, FileEntry, Manifest
from trainhouse.core.errors import DatasetError, NotFound, UploadTooLarge
from trainhouse.jobfs.datasources import manifest_of_tree, open_file
from trainhouse.jobfs.durable import publish
from trainhouse.jobfs.workdir import ArchiveLimits, extract, human_size

__all__ = ["DatasetFiles"]

CHUNK = 1 << 20
_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class DatasetFiles:
    """Manifests and stored objects under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- paths ------------------------------------------------------------------------------
    def _tmp(self) -> Path:
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp

    def _manifest_path(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise DatasetError(f"a manifest digest is 64 hex digits, not {digest[:80]!r}")
        return self.root / "manifests" / f"{digest}.json"

    def object_path(self, entry: FileEntry) -> Path:
        return self.root / "objects" / entry.algorithm / entry.digest[:2] / entry.digest

    # -- manifests --------------------------------------------------------------------------
    def write_manifest(self, manifest: Manifest) -> str:
        """Keep ``manifest`` (durably; once per digest); its digest."""
        digest = manifest.digest
        path = self._manifest_path(digest)
        if path.is_file():
            return digest
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(manifest.to_json(), separators=(",", ":")).encode()
        fd, tmp = tempfile.mkstemp(dir=self._tmp())
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            publish(Path(tmp), path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return digest

    def manifest(self, digest: str) -> Manifest:
        """The manifest named ``digest``, checked against its name."""
        path = self._manifest_path(digest)
        try:
            fd = os.open(path, _READ)
        except FileNotFoundError:
            raise NotFound(f"the manifest {digest[:12]} is not in the dataset storage") from None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise DatasetError(f"the manifest {digest[:12]} is not a regular file")
            manifest = Manifest.from_json(json.loads(fh.read()))
        if manifest.digest != digest:
            raise DatasetError(f"the manifest {digest[:12]} does not match its digest")
        return manifest

    def remove_manifest(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            self._manifest_path(digest).unlink()

    # -- objects ----------------------------------------------------------------------------
    def _publish(self, tmp: Path, entry: FileEntry) -> None:
        final = self.object_path(entry)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o400)
        os.replace(tmp, final)

    def has(self, entry: FileEntry) -> bool:
        try:
            st = os.lstat(self.object_path(entry))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == entry.size

    def open(self, entry: FileEntry) -> BinaryIO:
        """A stored file's bytes (no link followed, a regular file of the registered size)."""
        try:
            fd = os.open(self.object_path(entry), _READ)
        except FileNotFoundError:
            raise NotFound(f"{entry.path}: its bytes are not in the dataset storage") from None
        fh = os.fdopen(fd, "rb")
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            fh.close()
            raise DatasetError(f"{entry.path}: the stored copy is not the registered file")
        return fh

    def store_upload(
        self,
        stream: BinaryIO,
        max_bytes: int,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Manifest:
        """An uploaded directory (a .tar.gz, hostile: checked as a workdir upload is, no more
        than ``max_bytes`` in or out) unpacked, hashed and kept as objects; its manifest
        (written too)."""
        tmp = self._tmp()
        work = tmp / f"upload-{uuid.uuid4().hex}"
        archive = work.with_suffix(".tar.gz")
        try:
            size = 0
            with archive.open("wb") as out:
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > max_bytes:
                        raise UploadTooLarge(
                            f"the dataset upload is larger than {human_size(max_bytes)} "
                            "(the server's --dataset-upload-bytes)"
                        )
                    out.write(chunk)
            limits = ArchiveLimits(
                members=MAX_FILES * 2,  # files and their directories
                extracted_bytes=max_bytes,
                inflated_bytes=max_bytes + (max_bytes >> 3) + (64 << 20),
                ratio=1 << 20,  # data may be anything; the byte limits bound it
            )
            extract(archive, work / "files", limits)
            archive.unlink()
            manifest = manifest_of_tree(work / "files", progress=progress)
            for entry in manifest.files:
                source = work / "files" / entry.path
                if self.has(entry):
                    continue
                self._publish(source, entry)
            self.write_manifest(manifest)
            return manifest
        finally:
            with contextlib.suppress(OSError):
                archive.unlink()
            shutil.rmtree(work, ignore_errors=True)

    def copy_from(
        self,
        url: str,
        storage_options: dict[str, str],
        manifest: Manifest,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Copy a remote version's files here (``--copy``), each verified against the manifest
        as it is written."""
        total = manifest.size
        done = 0
        for entry in manifest.files:
            if self.has(entry):
                done += entry.size
                continue
            fd, name = tempfile.mkstemp(dir=self._tmp())
            tmp = Path(name)
            try:
                h = hashlib.new(entry.algorithm)
                written = 0
                with (
                    os.fdopen(fd, "wb") as out,
                    open_file(url, storage_options, entry.path) as src,
                ):
                    while chunk := src.read(CHUNK):
                        written += len(chunk)
                        if written > entry.size:
                            break
                        h.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(done + written, total)
                    out.flush()
                    os.fsync(out.fileno())
                if written != entry.size or h.hexdigest() != entry.digest:
                    raise DatasetError(
                        f"{entry.path} changed while it was copied (it is not the file that "
                        "was just listed); add the dataset again"
                    )
                self._publish(tmp, entry)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            done += entry.size

    def remove_unused(self, manifest: Manifest, still_used: Callable[[FileEntry], bool]) -> int:
        """Delete a removed version's stored objects that ``still_used`` says no other version
        holds; how many."""
        removed = 0
        for entry in manifest.files:
            if still_used(entry):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.object_path(entry))
                removed += 1
        return removed

    def iter_bytes(self, entry: FileEntry) -> Iterator[bytes]:
        with self.open(entry) as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
