"""How far the TensorBoard import has read each event file of a job
(``tensorboard_positions``): the byte offset after the last record whose points are stored,
so that a restarted server reads every file on from where the last one stopped. A job's rows
go with the job (:meth:`trainhouse.store.runs.RunsRepo.delete`)."""

from __future__ import annotations

import hashlib
import time

from sqlalchemy import select, update

from trainhouse.store import tables as t
from trainhouse.store.database import Database

__all__ = ["EventFilePositions", "path_key"]


def path_key(path: str) -> str:
    """The row's key for ``path`` (a job names its paths, of any length and bytes)."""
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()


class EventFilePositions:
    """The read position of each event file of a job, by its path below the job's
    TensorBoard directory."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, job_id: int) -> dict[str, int]:
        """Every file's position for ``job_id``, by path key (:func:`path_key`)."""
        table = t.tensorboard_positions
        with self.db.connect() as conn:
            rows = conn.execute(
                select(table.c.path_sha256, table.c.position).where(table.c.job_id == job_id)
            )
            return {key: int(position) for key, position in rows}

    def save(self, job_id: int, positions: dict[str, int]) -> None:
        """Set the positions of these files (by path) in one transaction."""
        if not positions:
            return
        table = t.tensorboard_positions
        now = time.time()
        with self.db.transaction() as conn:
            for path, position in positions.items():
                key = path_key(path)
                done = conn.execute(
                    update(table)
                    .where(table.c.job_id == job_id, table.c.path_sha256 == key)
                    .values(position=position, updated_at=now)
                )
                if done.rowcount == 0:
                    conn.execute(
                        table.insert().values(
                            job_id=job_id,
                            path_sha256=key,
                            path=path,
                            position=position,
                            updated_at=now,
                        )
                    )
