"""Rows the store tests start from: a job made straight in the store (no upload, no server), a
database left at an old revision with one job in it, and a stored workdir archive for a
scheduler loop to unpack."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import sqlalchemy as sa

from trainhouse.store import BlobStore, Store

TRAIN = {"entrypoint": "python train.py"}
# a job that waits for GPUs no test server has: a running scheduler leaves it queued
WAIT = {**TRAIN, "resources": {"gpus_per_node": 8}}


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


def old_store(url: str, revision: str) -> Store:
    """A store at migration ``revision`` (not upgraded further) holding job 1, COMPLETED, as
    the old schema's own columns put it (on SQLite or PostgreSQL); close it before opening
    ``url`` again to upgrade."""
    old = Store(url, migrate=False)
    old.upgrade(revision)
    with old.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, name, owner, state, priority, spec, archive_sha256, "
                "created_at, attempts, restarts, cancel_requested, updated_at) "
                "VALUES (1, 'j', 'ann', 'COMPLETED', 'normal', '{}', 'x', 0, 1, 0, false, 0)"
            )
        )
    return old


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
