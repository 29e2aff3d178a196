"""Persistent state: one Store over SQLAlchemy for SQLite and PostgreSQL, and the archive blobs."""

from trainhouse.store.blobs import BlobStore
from trainhouse.store.records import Attempt, Checkpoint, Event, Job, MetricPoint, UserLimits
from trainhouse.store.store import Store, default_db_url

__all__ = [
    "Attempt",
    "BlobStore",
    "Checkpoint",
    "Event",
    "Job",
    "MetricPoint",
    "Store",
    "UserLimits",
    "default_db_url",
]
