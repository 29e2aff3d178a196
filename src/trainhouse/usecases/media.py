"""Media jobs log: an image, a histogram or a table at a step (the SDK's ``run.log_image``,
``log_histogram``, ``log_table``), checked by :mod:`trainhouse.core.media` and stored within
the job's bounds by :mod:`trainhouse.store.media`; a job's items listed and read.

Storing needs the job's per-attempt credential (the route's ``reporting_job``); reading, the
right to read the job (``readable_job``). MLflow's ``log_image(key=, step=)`` and
``log_table`` are stored as media too (:func:`store_for_run`, :func:`mlflow_tables`), by a
caller who may write the run.
"""

from __future__ import annotations

from trainhouse.core.errors import InvalidMedia, InvalidTracking, NotFound
from trainhouse.core.media import (
    MAX_TABLE_FILE,
    Prepared,
    mlflow_table,
    parse_item,
    prepare_json,
)
from trainhouse.core.media import mlflow_tables as mlflow_table_paths
from trainhouse.core.records import Job
from trainhouse.store.media import MediaItem
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.tracking import artifacts
from trainhouse.usecases.tracking.callers import Caller, run_job

__all__ = ["MediaItem", "get", "items", "log", "mlflow_tables", "store", "store_for_run"]


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


# -- MLflow's log_image and log_table -------------------------------------------------------


def store_for_run(rt: Runtime, c: Caller, run: int, item: Prepared) -> MediaItem:
    """An image MLflow's ``log_image(key=, step=)`` uploaded to run ``run`` (one ``c`` may
    write), checked, stored as its job's media."""
    return store(rt, run_job(rt, c, run, write=True), item)


def mlflow_tables(rt: Runtime, c: Caller, job: Job, tag_value: str) -> list[str]:
    """The tables a run's ``mlflow.loggedArtifacts`` tag lists, read from its artifacts and
    stored as its job's media (key: the file's path, step 0: ``log_table`` appends rows to
    the same file); returns why each one not stored was refused."""
    refused = []
    for path in mlflow_table_paths(tag_value):
        try:
            parts = [p for p in path.split("/") if p]
            if any(p in (".", "..") or "\\" in p or "\x00" in p for p in parts):
                raise InvalidMedia(f"table path {path[:100]!r} is not a plain path")
            data = b""
            for chunk in artifacts.download(rt, c, int(job.id), parts):
                data += chunk
                if len(data) > MAX_TABLE_FILE:
                    raise InvalidMedia(f"an MLflow table's file is at most {MAX_TABLE_FILE} bytes")
            table = mlflow_table(data)
            store(rt, job, prepare_json(path, 0, "table", table))
        except (InvalidMedia, NotFound, InvalidTracking) as exc:
            refused.append(f"table {path[:100]!r}: {exc}")
    return refused
