"""Hyperparameter searches and their trials (``store.searches``).

A trial's row and its job are written in one transaction (:meth:`SearchRepo.add_trial`): a
trial has a job exactly when it has a row, whatever moment the server dies at. Optuna's side
(the study and its trials) lives in Optuna's own tables; :mod:`trainhouse.tune` reconciles the
two from these rows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import RowMapping

from trainhouse.core.errors import NotFound
from trainhouse.core.records import Search, Trial
from trainhouse.core.spec import JobSpec
from trainhouse.store import tables as t
from trainhouse.store.datasets import resolve_pins
from trainhouse.store.jobrows import insert_job

if TYPE_CHECKING:
    from trainhouse.store.database import Database

__all__ = ["SEARCH_STATES", "TRIAL_ACTIVE", "TRIAL_ENDED", "SearchRepo"]

SEARCH_STATES = ("RUNNING", "COMPLETED", "CANCELED")
TRIAL_ACTIVE = "ACTIVE"  # its job has not ended (QUEUED or RUNNING: read the job)
TRIAL_ENDED = ("COMPLETED", "PRUNED", "FAILED")

SearchList = list[Search]
TrialList = list[Trial]


def _search(row: RowMapping) -> Search:
    return Search(
        id=row["id"],
        name=row["name"],
        owner=row["owner"],
        state=row["state"],
        spec_data=row["spec"],
        archive_sha256=row["archive_sha256"],
        study=row["study"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        ended_at=row["ended_at"],
        reason=row["reason"],
        warning=row["warning"],
    )


def _trial(row: RowMapping) -> Trial:
    return Trial(
        search_id=row["search_id"],
        number=row["number"],
        trial_id=row["trial_id"],
        job_id=row["job_id"],
        params=row["params"],
        state=row["state"],
        value=row["value"],
        created_at=row["created_at"],
        ended_at=row["ended_at"],
    )


class SearchRepo:
    """Every read and write of searches and their trials."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- searches --------------------------------------------------------------------------
    def create(self, *, owner: str, spec: JobSpec, archive_sha256: str) -> Search:
        now = time.time()
        stored = spec.model_dump(mode="json")
        with self.db.transaction() as conn:
            # the versions its trials read, pinned once for all of them: data added while the
            # search runs never mixes two versions into one search
            pins = resolve_pins(conn, spec.datasets)
            if pins:
                stored["datasets"] = {p.key: p.ref for p in pins}
            search_id = conn.execute(
                insert(t.searches)
                .values(
                    name=spec.name,
                    owner=owner,
                    state="RUNNING",
                    spec=stored,
                    archive_sha256=archive_sha256,
                    # unique across servers sharing nothing but a database
                    study=f"trainhouse-{uuid.uuid4().hex}",
                    created_at=now,
                    updated_at=now,
                    reason="starting trials",
                )
                .returning(t.searches.c.id)
            ).scalar_one()
        return self.get(search_id)

    def get(self, search_id: int) -> Search:
        with self.db.connect() as conn:
            row = (
                conn.execute(select(t.searches).where(t.searches.c.id == search_id))
                .mappings()
                .first()
            )
        if row is None:
            raise NotFound(f"search {search_id} does not exist")
        return _search(row)

    def list(
        self,
        *,
        states: Iterable[str] | None = None,
        owner: str | None = None,
        limit: int | None = None,
    ) -> SearchList:
        """Searches, newest first."""
        query = select(t.searches).order_by(t.searches.c.id.desc())
        if states is not None:
            query = query.where(t.searches.c.state.in_(list(states)))
        if owner:
            query = query.where(t.searches.c.owner == owner)
        if limit is not None:
            query = query.limit(limit)
        with self.db.connect() as conn:
            return [_search(r) for r in conn.execute(query).mappings()]

    def ending(self) -> SearchList:
        """Searches that have ended (COMPLETED, CANCELED) with trials still active."""
        active = (
            select(t.search_trials.c.number)
            .where(
                t.search_trials.c.search_id == t.searches.c.id,
                t.search_trials.c.state == TRIAL_ACTIVE,
            )
            .exists()
        )
        query = select(t.searches).where(t.searches.c.state != "RUNNING", active)
        with self.db.connect() as conn:
            return [_search(r) for r in conn.execute(query.order_by(t.searches.c.id)).mappings()]

    def update(self, search_id: int, **fields: Any) -> None:
        fields.setdefault("updated_at", time.time())
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.searches).where(t.searches.c.id == search_id).values(**fields)
            )
        if result.rowcount == 0:
            raise NotFound(f"search {search_id} does not exist")

    def end(self, search_id: int, state: str, reason: str) -> bool:
        """RUNNING -> ``state`` (COMPLETED or CANCELED); False if it was not RUNNING."""
        now = time.time()
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.searches)
                .where(t.searches.c.id == search_id, t.searches.c.state == "RUNNING")
                .values(state=state, reason=reason, ended_at=now, updated_at=now)
            )
        return bool(result.rowcount)

    def warn_once(self, search_id: int, warning: str) -> bool:
        """Keep ``warning`` unless the search has one already; whether it was kept."""
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.searches)
                .where(t.searches.c.id == search_id, t.searches.c.warning.is_(None))
                .values(warning=warning, updated_at=time.time())
            )
        return bool(result.rowcount)

    # -- trials ----------------------------------------------------------------------------
    def add_trial(
        self,
        search: Search,
        *,
        number: int,
        trial_id: int,
        params: dict[str, Any],
        spec: JobSpec,
    ) -> Trial | None:
        """Trial ``number`` and its QUEUED job, in one transaction; None if the trial has a row
        already (it was added before a restart)."""
        now = time.time()
        with self.db.transaction() as conn:
            exists = conn.execute(
                select(t.search_trials.c.number).where(
                    t.search_trials.c.search_id == search.id,
                    t.search_trials.c.number == number,
                )
            ).first()
            if exists is not None:
                return None
            job_id = insert_job(
                conn,
                name=spec.name,
                owner=search.owner,
                priority=spec.priority,
                spec=spec,
                archive_sha256=search.archive_sha256,
                search_id=search.id,
                reason=f"trial {number} of search {search.id}",
            )
            conn.execute(
                insert(t.search_trials).values(
                    search_id=search.id,
                    number=number,
                    trial_id=trial_id,
                    job_id=job_id,
                    params=params,
                    state=TRIAL_ACTIVE,
                    created_at=now,
                )
            )
        return Trial(search.id, number, trial_id, job_id, params, TRIAL_ACTIVE, None, now)

    def trials(self, search_id: int) -> TrialList:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.search_trials)
                .where(t.search_trials.c.search_id == search_id)
                .order_by(t.search_trials.c.number)
            ).mappings()
            return [_trial(r) for r in rows]

    def trial_of_job(self, job_id: int) -> Trial | None:
        with self.db.connect() as conn:
            row = (
                conn.execute(select(t.search_trials).where(t.search_trials.c.job_id == job_id))
                .mappings()
                .first()
            )
        return _trial(row) if row is not None else None

    def counts(self, search_ids: Iterable[int]) -> dict[int, dict[str, int]]:
        """Trials per search and state (ACTIVE, COMPLETED, PRUNED, FAILED)."""
        ids = list(search_ids)
        out: dict[int, dict[str, int]] = {i: {} for i in ids}
        if not ids:
            return out
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.search_trials.c.search_id, t.search_trials.c.state, func.count())
                .where(t.search_trials.c.search_id.in_(ids))
                .group_by(t.search_trials.c.search_id, t.search_trials.c.state)
            )
            for search_id, state, count in rows:
                out[search_id][state] = int(count)
        return out

    def finish_trial(self, search_id: int, number: int, state: str, value: float | None) -> None:
        """Record the trial's end (once Optuna was told of it)."""
        with self.db.transaction() as conn:
            conn.execute(
                update(t.search_trials)
                .where(
                    t.search_trials.c.search_id == search_id,
                    t.search_trials.c.number == number,
                    t.search_trials.c.state == TRIAL_ACTIVE,
                )
                .values(state=state, value=value, ended_at=time.time())
            )
