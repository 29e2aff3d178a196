"""Rows the store tests start from: a job made straight in the store (no upload, no server),
and a stored workdir archive for a scheduler loop to unpack."""

from __future__ import annotations

import io
import tarfile
from typing import Any

from trainhouse.store import BlobStore, Store

TRAIN = {"entrypoint": "python train.py"}


def new_job(
    store: Store,
    *,
    name: str = "j",
    owner: str = "ann",
    priority: str = "normal",
    spec: dict[str, Any] | None = None,
    archive_sha256: str = "0" * 64,
) -> int:
    """A queued job's id; its spec runs ``python train.py`` unless ``spec`` says otherwise."""
    return store.jobs.create(
        name=name,
        owner=owner,
        priority=priority,
        spec=TRAIN if spec is None else spec,
        archive_sha256=archive_sha256,
    ).id


def stored_archive(blobs: BlobStore) -> str:
    """The sha256 of a workdir archive of one file, ``train.py``, put into ``blobs``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    digest, _ = blobs.put(buf, 1 << 20)
    return digest
