"""Rows the store tests start from: a job made straight in the store (no upload, no server)."""

from __future__ import annotations

from typing import Any

from trainhouse.store import Store

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
