"""The audit log as the use cases write it: who did what to what, from which address.

A use case records its action inside the transaction of the change itself
(:meth:`trainhouse.store.database.Database.transaction` joins an open one), so a change and its
entry commit together or not at all. What is audited: every write an admin or a user makes to
shared state (jobs, searches, the registry, services, accounts, quotas); reads are not.
"""

from __future__ import annotations

from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime


def record(
    rt: Runtime, p: Principal, action: str, target: str | None = None, **detail: object
) -> None:
    """Record ``p``'s ``action`` on ``target`` (``job:12``, ``user:ana``) with ``detail``."""
    rt.store.accounts.audit(
        p.name, action, target, detail=dict(detail) or None, client=p.client or None
    )
