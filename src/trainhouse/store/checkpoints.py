"""Checkpoint records (``store.checkpoints``): what each job saved, where, with which sha256.

The files themselves live in the job's checkpoint storage (:mod:`trainhouse.jobfs.storage`); the
server registers, verifies and retires them through :mod:`trainhouse.ingest.checkpoints`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import RowMapping

from trainhouse.core.errors import NotFound
from trainhouse.core.records import Checkpoint
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["CheckpointRepo"]

CheckpointList = list[Checkpoint]  # ``CheckpointRepo.list`` shadows the builtin in the class


def _checkpoint(row: RowMapping) -> Checkpoint:
    return Checkpoint(
        id=row["id"],
        job_id=row["job_id"],
        attempt=row["attempt"],
        step=row["step"],
        path=row["path"],
        size=row["size"],
        sha256=row["sha256"],
        metrics=row["metrics"] or {},
        created_at=row["created_at"],
        deleted=bool(row["deleted"]),
        kind=row["kind"],
        corrupt=row["corrupt"],
        algorithm=row["algorithm"],
    )


_c = t.checkpoints.c
#: a checkpoint at the same path listed no more (``CheckpointRepo.add``'s ``replace``)
_REPLACE = (
    update(t.checkpoints)
    .where(_c.job_id == bindparam("b_job"), _c.path == bindparam("b_path"), _c.deleted.is_(False))
    .values(deleted=True)
)
#: a checkpoint's row (every column but its id and ``corrupt``), its id returned
_INSERT = insert(t.checkpoints).returning(_c.id)


class CheckpointRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(
        self,
        job_id: int,
        *,
        attempt: int,
        step: int,
        path: str,
        size: int,
        sha256: str,
        metrics: dict[str, float | None] | None = None,
        kind: str = "file",
        algorithm: str = "sha256",
        replace: bool = False,
    ) -> Checkpoint:
        """Record a checkpoint; ``replace``: one at the same path (the same step written
        again, after a restart) is listed no more, in the same transaction. Both statements
        are built once (:data:`_REPLACE`, :data:`_INSERT`): built per call, they cost more
        CPU than the database spent on them (a registration's record, issue 34)."""
        with self.db.transaction() as conn:
            if replace:
                conn.execute(_REPLACE, {"b_job": job_id, "b_path": path})
            made = Checkpoint(
                id=0,
                job_id=job_id,
                attempt=attempt,
                step=step,
                path=path,
                size=size,
                sha256=sha256,
                metrics=metrics or {},
                created_at=time.time(),
                deleted=False,
                kind=kind,
                corrupt=None,
                algorithm=algorithm,
            )
            values = {
                "job_id": job_id,
                "attempt": attempt,
                "step": step,
                "path": path,
                "size": size,
                "sha256": sha256,
                "metrics": made.metrics,
                "created_at": made.created_at,
                "deleted": False,
                "kind": kind,
                "algorithm": algorithm,
            }
            ckpt_id = conn.execute(_INSERT, values).scalar_one()
        # the row is what was inserted (no column has a default of the database's)
        return dataclasses.replace(made, id=ckpt_id)

    def list(self, job_id: int, *, include_deleted: bool = False) -> CheckpointList:
        """A job's checkpoints by step (then id); deleted ones only with ``include_deleted``."""
        query = select(t.checkpoints).where(t.checkpoints.c.job_id == job_id)
        if not include_deleted:
            query = query.where(t.checkpoints.c.deleted.is_(False))
        query = query.order_by(t.checkpoints.c.step, t.checkpoints.c.id)
        with self.db.connect() as conn:
            return [_checkpoint(r) for r in conn.execute(query).mappings()]

    def get(self, job_id: int, checkpoint_id: int) -> Checkpoint:
        with self.db.connect() as conn:
            row = (
                conn.execute(
                    select(t.checkpoints).where(
                        t.checkpoints.c.job_id == job_id, t.checkpoints.c.id == checkpoint_id
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"job {job_id} has no checkpoint {checkpoint_id}")
        return _checkpoint(row)

    def mark_corrupt(self, checkpoint_id: int, reason: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                update(t.checkpoints)
                .where(t.checkpoints.c.id == checkpoint_id, t.checkpoints.c.corrupt.is_(None))
                .values(corrupt=reason)
            )

    def mark_deleted(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self.db.transaction() as conn:
            conn.execute(
                update(t.checkpoints).where(t.checkpoints.c.id.in_(ids)).values(deleted=True)
            )

    def last_times(self, job_ids: Sequence[int]) -> dict[int, float]:
        """When each job last registered a checkpoint (jobs without one are left out)."""
        if not job_ids:
            return {}
        query = (
            select(t.checkpoints.c.job_id, func.max(t.checkpoints.c.created_at))
            .where(t.checkpoints.c.job_id.in_(list(job_ids)))
            .group_by(t.checkpoints.c.job_id)
        )
        with self.db.connect() as conn:
            return {int(j): float(at) for j, at in conn.execute(query)}
