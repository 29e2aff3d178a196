"""The images, histograms and tables jobs log (``job_media``): storing one within its job's
bounds, listing a job's, reading one.

An item is one (key, step) of a job; logging the same again replaces it. A key holds one kind.
A job's items are bounded in number and bytes (:data:`~trainhouse.core.media.MAX_MEDIA_ITEMS`,
:data:`~trainhouse.core.media.MAX_MEDIA_BYTES`), counted in the transaction that stores one,
after the transactions that stored one before it for the same job have committed (PostgreSQL:
:data:`MEDIA_LOCK`, held to the end of the transaction; SQLite: its one writer at a time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from trainhouse.core.errors import InvalidMedia, NotFound
from trainhouse.core.media import MAX_MEDIA_BYTES, MAX_MEDIA_ITEMS
from trainhouse.store import tables as t
from trainhouse.store.database import Database

MEDIA_LOCK = 0x6D656469  # "medi"


@dataclass(frozen=True)
class MediaItem:
    """One logged item, without its bytes."""

    id: int
    job_id: int
    key: str
    step: int
    kind: str
    width: int | None
    height: int | None
    caption: str | None
    size: int
    created_at: float


_COLUMNS = (
    t.job_media.c.id,
    t.job_media.c.job_id,
    t.job_media.c.key,
    t.job_media.c.step,
    t.job_media.c.kind,
    t.job_media.c.width,
    t.job_media.c.height,
    t.job_media.c.caption,
    t.job_media.c.size,
    t.job_media.c.created_at,
)


def _item(row: Any) -> MediaItem:
    return MediaItem(*tuple(row))


class MediaRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(
        self,
        job_id: int,
        *,
        key: str,
        step: int,
        kind: str,
        data: bytes,
        width: int | None = None,
        height: int | None = None,
        caption: str | None = None,
        max_items: int = MAX_MEDIA_ITEMS,
        max_bytes: int = MAX_MEDIA_BYTES,
    ) -> MediaItem:
        """Store one checked item (replacing the job's item at the same key and step).
        Raises :class:`InvalidMedia`, storing nothing, if the key holds another kind or the
        item would take the job past its bounds."""
        m = t.job_media.c
        with self.db.transaction() as conn:
            self._lock(conn, job_id)
            other = conn.execute(
                select(m.kind).where(m.job_id == job_id, m.key == key, m.kind != kind).limit(1)
            ).first()
            if other is not None:
                raise InvalidMedia(f"key {key!r} of job {job_id} holds {other[0]}s, not {kind}s")
            old = conn.execute(
                select(m.id, m.size).where(m.job_id == job_id, m.key == key, m.step == step)
            ).first()
            count, total = conn.execute(
                select(func.count(), func.coalesce(func.sum(m.size), 0)).where(m.job_id == job_id)
            ).one()
            count, total = int(count), int(total)
            if old is not None:
                count, total = count - 1, total - int(old[1])
            if count + 1 > max_items:
                raise InvalidMedia(
                    f"a job may log at most {max_items} media items (an image, a histogram or "
                    f"a table at one step each); job {job_id} has {count}: log fewer steps"
                )
            if total + len(data) > max_bytes:
                raise InvalidMedia(
                    f"a job may log at most {max_bytes} bytes of media; job {job_id} has "
                    f"{total}, and this {kind} is {len(data)}: log smaller or fewer images"
                )
            values = {
                "kind": kind,
                "data": data,
                "size": len(data),
                "width": width,
                "height": height,
                "caption": caption,
                "created_at": time.time(),
            }
            if old is not None:
                conn.execute(t.job_media.update().where(m.id == old[0]).values(**values))
                item_id = int(old[0])
            else:
                result = conn.execute(
                    t.job_media.insert().values(job_id=job_id, key=key, step=step, **values)
                )
                assert result.inserted_primary_key is not None
                item_id = int(result.inserted_primary_key[0])
            row = conn.execute(select(*_COLUMNS).where(m.id == item_id)).one()
        return _item(row)

    def _lock(self, conn: Connection, job_id: int) -> None:
        """Wait for the transactions storing media before this one to commit: their items
        are counted then. SQLite: a write first (which begins the transaction and takes the
        database's write lock, waited for); PostgreSQL: :data:`MEDIA_LOCK` for the job."""
        if self.db.dialect == "sqlite":
            jobs = t.jobs.c
            conn.execute(t.jobs.update().where(jobs.id == job_id).values(id=jobs.id))
        else:
            conn.execute(
                text("SELECT pg_advisory_xact_lock(:a, :b)"),
                {"a": MEDIA_LOCK, "b": job_id & 0x7FFFFFFF},
            )

    def list(self, job_id: int) -> list[MediaItem]:
        """The job's items, by key then step."""
        m = t.job_media.c
        with self.db.connect() as conn:
            rows = conn.execute(
                select(*_COLUMNS).where(m.job_id == job_id).order_by(m.key, m.step)
            ).all()
        return [_item(r) for r in rows]

    def get(self, job_id: int, item_id: int) -> tuple[MediaItem, bytes]:
        """One item of the job and its bytes (a PNG, or JSON)."""
        m = t.job_media.c
        with self.db.connect() as conn:
            row = conn.execute(
                select(*_COLUMNS, m.data).where(m.job_id == job_id, m.id == item_id)
            ).first()
        if row is None:
            raise NotFound(f"job {job_id} has no media item {item_id}")
        return _item(row[:-1]), bytes(row[-1])
