"""Media jobs log: an image, a histogram or a table at a step (the SDK's ``run.log_image``,
``log_histogram``, ``log_table``), checked by :mod:`trainhouse.core.media` and stored within
the job's bounds by :mod:`trainhouse.store.media`; a job's items listed and read.

Storing needs the job's per-attempt credential (the route's ``reporting_job``); reading, the
right to read the job (``readable_job``).
"""

from __future__ import annotations

from trainhouse.core.media import Prepared, parse_item
from trainhouse.core.records import Job
from trainhouse.store.media import MediaItem
from trainhouse.usecases.runtime import Runtime

__all__ = ["MediaItem", "get", "items", "log", "store"]


def store(rt: Runtime, job: Job, item: Prepared) -> MediaItem:
    """Store a checked item of ``job`` (its credential checked)."""
    return rt.store.media.add(
        job.id,
        key=item.key,
        step=item.step,
        kind=item.kind,
        data=item.data,
        width=item.width,
        height=item.height,
        caption=item.caption,
    )


def log(rt: Runtime, job: Job, body: bytes) -> MediaItem:
    """One item as the SDK sends it (:func:`trainhouse.core.media.parse_item`), stored."""
    return store(rt, job, parse_item(body))


def items(rt: Runtime, job: Job) -> list[MediaItem]:
    """The job's items (no bytes), by key then step."""
    return rt.store.media.list(job.id)


def get(rt: Runtime, job: Job, item_id: int) -> tuple[MediaItem, bytes]:
    """One item of the job and its stored bytes (a PNG, or JSON)."""
    return rt.store.media.get(job.id, item_id)
