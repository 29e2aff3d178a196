"""Services (``store.services``): a model served by a long-running job of replicas.

A service row names what it follows (``model`` and ``ref``: an alias, ``latest`` or a version
number) and how it is served; ``job_id`` is the job that runs its replicas, inserted in the same
transaction as the row (:meth:`ServiceRepo.create`), so a service never lacks its job nor a job
its service. Starting a service under the name of a stopped or ended one reuses the row with a
new job; its history stays in that job's records.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.engine import RowMapping

from trainhouse.core.errors import NotFound, StoreError
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.records import ServiceRecord
from trainhouse.store import tables as t
from trainhouse.store.jobrows import insert_job

if TYPE_CHECKING:
    from trainhouse.core.spec import JobSpec
    from trainhouse.store.database import Database

__all__ = ["ServiceRepo"]


def _record(row: RowMapping) -> ServiceRecord:
    return ServiceRecord(
        id=int(row["id"]),
        name=str(row["name"]),
        owner=str(row["owner"]),
        model=str(row["model"]),
        ref=str(row["ref"]),
        replicas=int(row["replicas"]),
        gpus_per_replica=int(row["gpus_per_replica"]),
        max_batch=int(row["max_batch"]),
        max_wait_ms=float(row["max_wait_ms"]),
        priority=str(row["priority"]),
        stopped=bool(row["stopped"]),
        job_id=None if row["job_id"] is None else int(row["job_id"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


class ServiceRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    def list(self) -> list[ServiceRecord]:
        """Every service, by name."""
        with self.db.connect() as conn:
            rows = conn.execute(select(t.services).order_by(t.services.c.name)).mappings()
            return [_record(r) for r in rows]

    def get(self, name: str) -> ServiceRecord:
        with self.db.connect() as conn:
            row = conn.execute(select(t.services).where(t.services.c.name == name)).mappings()
            found = row.first()
        if found is None:
            raise NotFound(f"no service named {name!r}")
        return _record(found)

    def of_job(self, job_id: int) -> ServiceRecord | None:
        """The service whose replicas ``job_id`` runs now, if any."""
        with self.db.connect() as conn:
            row = conn.execute(select(t.services).where(t.services.c.job_id == job_id))
            found = row.mappings().first()
        return None if found is None else _record(found)

    def create(
        self,
        *,
        name: str,
        owner: str,
        model: str,
        ref: str,
        replicas: int,
        gpus_per_replica: int,
        max_batch: int,
        max_wait_ms: float,
        priority: str,
        spec: JobSpec,
        archive_sha256: str,
    ) -> ServiceRecord:
        """A service and the QUEUED job of its replicas, in one transaction. A name in use by
        a service whose job has not ended is refused (409); an ended one's row is reused."""
        now = time.time()
        values: dict[str, Any] = {
            "owner": owner,
            "model": model,
            "ref": ref,
            "replicas": replicas,
            "gpus_per_replica": gpus_per_replica,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
            "priority": priority,
            "stopped": False,
            "updated_at": now,
        }
        with self.db.transaction() as conn:
            old = conn.execute(
                select(t.services.c.id, t.services.c.stopped, t.jobs.c.state, t.jobs.c.id)
                .outerjoin(t.jobs, t.jobs.c.id == t.services.c.job_id)
                .where(t.services.c.name == name)
                .with_for_update(of=t.services)
            ).first()
            if old is not None and old[2] is not None and old[2] not in TERMINAL:
                if old[1]:
                    raise StoreError(
                        f"service {name!r} is stopping: its job {old[3]} has not ended yet; "
                        "start it again once it has"
                    )
                raise StoreError(
                    f"service {name!r} is running (job {old[3]}): stop it first "
                    f"(trainhouse serve stop {name}) or choose another --name"
                )
            job_id = insert_job(
                conn,
                name=spec.name,
                owner=owner,
                priority=priority,
                spec=spec,
                archive_sha256=archive_sha256,
                reason=f"submitted as the replicas of service {name}",
            )
            values["job_id"] = job_id
            if old is None:
                conn.execute(t.services.insert().values(name=name, created_at=now, **values))
            else:
                conn.execute(update(t.services).where(t.services.c.id == old[0]).values(**values))
        return self.get(name)

    def set_stopped(self, name: str) -> ServiceRecord:
        with self.db.transaction() as conn:
            done = conn.execute(
                update(t.services)
                .where(t.services.c.name == name)
                .values(stopped=True, updated_at=time.time())
            )
        if not done.rowcount:
            raise NotFound(f"no service named {name!r}")
        return self.get(name)
