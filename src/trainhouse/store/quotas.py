"""Per-user limits and fair-share usage (``store.quotas``): what the scheduler's policy reads.

Limits are set by admins (``trainhouse admin quota``); usage is the scheduler's decayed
cluster-seconds per user (:mod:`trainhouse.scheduler.fairshare`), saved every few seconds so a
restarted server keeps its fair share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import delete, insert, select, update

from trainhouse.core.records import UserLimits
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["QuotaRepo"]


class QuotaRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    def limits(self) -> dict[str, UserLimits]:
        with self.db.connect() as conn:
            rows = conn.execute(select(t.user_limits).order_by(t.user_limits.c.owner)).mappings()
            return {r["owner"]: UserLimits(**r) for r in rows}

    def set(self, limits: UserLimits) -> UserLimits:
        values = {"share": limits.share, "max_gpus": limits.max_gpus, "max_cpus": limits.max_cpus}
        with self.db.transaction() as conn:
            found = conn.execute(
                update(t.user_limits).where(t.user_limits.c.owner == limits.owner).values(**values)
            )
            if found.rowcount == 0:
                conn.execute(insert(t.user_limits).values(owner=limits.owner, **values))
        return limits

    def delete(self, owner: str) -> bool:
        with self.db.transaction() as conn:
            result = conn.execute(delete(t.user_limits).where(t.user_limits.c.owner == owner))
        return result.rowcount > 0

    def usage(self) -> tuple[dict[str, float], float | None]:
        """Decayed fair-share usage per user and when it was last saved."""
        with self.db.connect() as conn:
            rows = conn.execute(select(t.user_usage)).mappings().all()
        if not rows:
            return {}, None
        return {r["owner"]: r["usage"] for r in rows}, max(r["updated_at"] for r in rows)

    def save_usage(self, values: dict[str, float], at: float) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(t.user_usage))
            if values:
                conn.execute(
                    insert(t.user_usage),
                    [{"owner": o, "usage": u, "updated_at": at} for o, u in values.items()],
                )
