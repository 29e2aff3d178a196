"""Persistent state: one Store over SQLAlchemy for SQLite and PostgreSQL, and the archive blobs.

``Store(url)`` opens the database (migrating the embedded SQLite) and offers one repository per
concern (``store.jobs``, ``.checkpoints``, ``.metrics``, ``.quotas``, ``.accounts``, ``.system``,
``.tracking``, ``.searches``, ``.models``, ``.runs``, ``.services``) over a public transaction; see
:mod:`trainhouse.store.store`.
"""

from trainhouse.core.records import (
    Attempt,
    Checkpoint,
    Event,
    Job,
    MetricPoint,
    Model,
    ModelVersion,
    Search,
    ServiceRecord,
    Trial,
    UserLimits,
)
from trainhouse.store.blobs import BlobStore
from trainhouse.store.database import SchemaStatus, default_db_url
from trainhouse.store.store import Store

__all__ = [
    "Attempt",
    "BlobStore",
    "Checkpoint",
    "Event",
    "Job",
    "MetricPoint",
    "Model",
    "ModelVersion",
    "SchemaStatus",
    "Search",
    "ServiceRecord",
    "Store",
    "Trial",
    "UserLimits",
    "default_db_url",
]
