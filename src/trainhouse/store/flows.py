"""Flows and the links between jobs: the flows' rows, the jobs each queued job waits for
(``job_after``), the model versions a job read (``job_inputs``) and promotions.

A job's ``after:`` rows and its pending promotion are written with the job
(:func:`trainhouse.store.jobrows.insert_job`); the scheduler reads :meth:`FlowRepo.upstreams` at
every tick, pins inputs as an attempt starts and decides promotions as a job completes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.orm import aliased

from trainhouse.core.datasets import FileEntry, Manifest, Pin, StagedSource
from trainhouse.core.errors import FlowError, NotFound
from trainhouse.core.flows import Upstream, parse_input_ref
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Flow, InputPin, Job, Promotion
from trainhouse.store import tables as t
from trainhouse.store.jobrows import job_from_row

if TYPE_CHECKING:
    from trainhouse.core.records import ModelVersion
    from trainhouse.store.database import Database
    from trainhouse.store.models import ModelRepo

__all__ = ["FlowRepo"]

FlowList = list[Flow]
PinList = list[InputPin]
IdList = list[int]
IdsBy = dict[int, list[int]]
JobsByFlow = dict[int, list[Job]]
UpstreamMap = dict[int, list[Upstream]]
SourceList = list[StagedSource]
PromotionList = list[Promotion]
StepList = list[dict[str, Any]]


def _flow(row: RowMapping) -> Flow:
    return Flow(
        id=int(row["id"]),
        name=row["name"],
        owner=row["owner"],
        created_at=float(row["created_at"]),
        steps=list(row["steps"] or []),
    )


def _pin(row: RowMapping) -> InputPin:
    return InputPin(
        job_id=int(row["job_id"]),
        key=row["key"],
        ref=row["ref"],
        model=row["model"],
        version=int(row["version"]),
        digest=row["digest"],
        attempt=int(row["attempt"]),
        resolved_at=float(row["resolved_at"]),
    )


def manifest_of(version: ModelVersion) -> Manifest:
    """A model version's files as a manifest (each file's sha256 from its record), what a node
    stages it by."""
    return Manifest.of(
        FileEntry(str(f["name"]), int(f["size"]), "sha256", str(f["sha256"])) for f in version.files
    )


def _promotion(row: RowMapping) -> Promotion:
    return Promotion(
        job_id=int(row["job_id"]),
        alias=row["alias"],
        metric=row["metric"],
        mode=row["mode"],
        model=row["model"],
        version=row["version"],
        value=row["value"],
        previous_version=row["previous_version"],
        previous_value=row["previous_value"],
        promoted=None if row["promoted"] is None else bool(row["promoted"]),
        decision=row["decision"],
        decided_at=row["decided_at"],
    )


class FlowRepo:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- flows -----------------------------------------------------------------------------
    def create(self, conn: Connection, *, name: str, owner: str) -> int:
        """A new flow's row, in the caller's transaction (its steps are set once its jobs
        exist: :meth:`set_steps`)."""
        flow_id: int = conn.execute(
            insert(t.flows)
            .values(name=name, owner=owner, created_at=time.time(), steps=[])
            .returning(t.flows.c.id)
        ).scalar_one()
        return flow_id

    def set_steps(self, conn: Connection, flow_id: int, steps: StepList) -> None:
        conn.execute(update(t.flows).where(t.flows.c.id == flow_id).values(steps=steps))

    def get(self, flow_id: int) -> Flow:
        with self.db.connect() as conn:
            row = conn.execute(select(t.flows).where(t.flows.c.id == flow_id)).mappings().first()
        if row is None:
            raise NotFound(f"flow {flow_id} does not exist")
        return _flow(row)

    def list(self, *, owner: str | None = None, limit: int = 200, offset: int = 0) -> FlowList:
        """Flows, newest first (``owner``: only theirs)."""
        query = select(t.flows).order_by(t.flows.c.id.desc()).limit(limit).offset(offset)
        if owner is not None:
            query = query.where(t.flows.c.owner == owner)
        with self.db.connect() as conn:
            return [_flow(r) for r in conn.execute(query).mappings()]

    def count(self, *, owner: str | None = None) -> int:
        from sqlalchemy import func

        query = select(func.count()).select_from(t.flows)
        if owner is not None:
            query = query.where(t.flows.c.owner == owner)
        with self.db.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def jobs(self, flow_ids: Iterable[int]) -> JobsByFlow:
        """The jobs of each flow, by flow (a deleted step is missing)."""
        wanted = list(flow_ids)
        found: JobsByFlow = {f: [] for f in wanted}
        if not wanted:
            return found
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.jobs).where(t.jobs.c.flow_id.in_(wanted)).order_by(t.jobs.c.id)
            ).mappings()
            for row in rows:
                job = job_from_row(row)
                assert job.flow_id is not None
                found[job.flow_id].append(job)
        return found

    # -- jobs that wait for jobs -----------------------------------------------------------
    def upstreams(self, job_ids: Iterable[int] | None = None) -> UpstreamMap:
        """What each QUEUED job waits for (``job_ids``: those jobs, whatever their state), with
        each upstream's state now (None: deleted)."""
        up = aliased(t.jobs)
        query = (
            select(t.job_after.c.job_id, t.job_after.c.upstream_id, t.job_after.c.until, up.c.state)
            .select_from(t.job_after)
            .outerjoin(up, up.c.id == t.job_after.c.upstream_id)
        )
        if job_ids is None:
            query = query.join(t.jobs, t.jobs.c.id == t.job_after.c.job_id).where(
                t.jobs.c.state == JobState.QUEUED
            )
        else:
            wanted = list(job_ids)
            if not wanted:
                return {}
            query = query.where(t.job_after.c.job_id.in_(wanted))
        found: UpstreamMap = {}
        with self.db.connect() as conn:
            for job_id, upstream, until, state in conn.execute(query):
                found.setdefault(int(job_id), []).append(
                    Upstream(int(upstream), str(until), None if state is None else str(state))
                )
        return found

    def dependents(self, job_id: int) -> IdList:
        """The jobs that wait for ``job_id`` (in any state)."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.job_after.c.job_id)
                .where(t.job_after.c.upstream_id == job_id)
                .order_by(t.job_after.c.job_id)
            )
            return [int(r[0]) for r in rows]

    # -- inputs ----------------------------------------------------------------------------
    def inputs(self, job_id: int) -> PinList:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.job_inputs)
                .where(t.job_inputs.c.job_id == job_id)
                .order_by(t.job_inputs.c.key)
            ).mappings()
            return [_pin(r) for r in rows]

    def pin_inputs(self, job_id: int, pins: Iterable[InputPin]) -> None:
        """Record what the job reads (replacing what an earlier resolution said)."""
        rows = [
            {
                "job_id": job_id,
                "key": p.key,
                "ref": p.ref[:200],
                "model": p.model,
                "version": p.version,
                "digest": p.digest,
                "attempt": p.attempt,
                "resolved_at": p.resolved_at,
            }
            for p in pins
        ]
        with self.db.transaction() as conn:
            conn.execute(delete(t.job_inputs).where(t.job_inputs.c.job_id == job_id))
            if rows:
                conn.execute(insert(t.job_inputs), rows)

    def resolve_inputs(self, job: Job, attempt: int, models: ModelRepo) -> SourceList:
        """The model versions ``job`` reads (its ``inputs:``), as a node stages them: those its
        earlier attempts resolved, else resolved now (``job:31``: the version job 31 saved
        last; ``NAME@REF``: the registry's) and recorded. FlowError naming the input."""
        wanted = job.spec.inputs
        if not wanted:
            return []
        pinned = {p.key: p for p in self.inputs(job.id)}
        if set(pinned) != set(wanted) or any(pinned[k].ref != r for k, r in wanted.items()):
            pins = []
            now = time.time()
            for key, ref in sorted(wanted.items()):
                version = _resolve(key, ref, models)
                pins.append(
                    InputPin(
                        job.id,
                        key,
                        ref,
                        version.model,
                        version.version,
                        manifest_of(version).digest,
                        attempt,
                        now,
                    )
                )
            self.pin_inputs(job.id, pins)
            pinned = {p.key: p for p in pins}
        return [
            StagedSource(Pin(p.key, p.model, p.version, p.digest), kind="model")
            for p in pinned.values()
        ]

    def clear_inputs(self, job_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(t.job_inputs).where(t.job_inputs.c.job_id == job_id))

    def readers(self, model: str, *, limit: int = 200) -> IdsBy:
        """The jobs that read each version of ``model`` as an input, newest first."""
        found: IdsBy = {}
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.job_inputs.c.version, t.job_inputs.c.job_id)
                .where(t.job_inputs.c.model == model)
                .order_by(t.job_inputs.c.version, t.job_inputs.c.job_id.desc())
            )
            for version, job_id in rows:
                jobs = found.setdefault(int(version), [])
                if len(jobs) < limit:
                    jobs.append(int(job_id))
        return found

    # -- promotions ------------------------------------------------------------------------
    def promotion(self, job_id: int) -> Promotion | None:
        with self.db.connect() as conn:
            row = (
                conn.execute(select(t.promotions).where(t.promotions.c.job_id == job_id))
                .mappings()
                .first()
            )
        return None if row is None else _promotion(row)

    def undecided(self) -> IdList:
        """COMPLETED jobs whose promotion is not decided yet (the server stopped between the
        two), oldest first."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.promotions.c.job_id)
                .join(t.jobs, t.jobs.c.id == t.promotions.c.job_id)
                .where(t.promotions.c.decided_at.is_(None), t.jobs.c.state == JobState.COMPLETED)
                .order_by(t.promotions.c.job_id)
            )
            return [int(r[0]) for r in rows]

    def claim(self, conn: Connection, job_id: int) -> Promotion | None:
        """The job's promotion, if still undecided, with the row written first: on SQLite
        the transaction holds the write lock from here, so no alias move interleaves."""
        done = conn.execute(
            update(t.promotions)
            .where(t.promotions.c.job_id == job_id, t.promotions.c.decided_at.is_(None))
            .values(decision=None)
        ).rowcount
        if not done:
            return None
        row = (
            conn.execute(select(t.promotions).where(t.promotions.c.job_id == job_id))
            .mappings()
            .first()
        )
        return None if row is None else _promotion(row)

    def decide(self, conn: Connection, job_id: int, **values: Any) -> None:
        conn.execute(
            update(t.promotions)
            .where(t.promotions.c.job_id == job_id)
            .values(decided_at=time.time(), **values)
        )

    def promotions(self, model: str, *, limit: int = 200) -> PromotionList:
        """The decisions made about ``model``'s versions, newest first."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.promotions)
                .where(t.promotions.c.model == model, t.promotions.c.decided_at.is_not(None))
                .order_by(t.promotions.c.decided_at.desc())
                .limit(limit)
            ).mappings()
            return [_promotion(r) for r in rows]

    def last_promoted_value(
        self, conn: Connection, model: str, version: int, alias: str, metric: str
    ) -> float | None:
        """The value of ``metric`` that last promoted ``model@version`` to ``alias``."""
        row = conn.execute(
            select(t.promotions.c.value)
            .where(
                t.promotions.c.model == model,
                t.promotions.c.version == version,
                t.promotions.c.alias == alias,
                t.promotions.c.metric == metric,
                t.promotions.c.promoted.is_(True),
            )
            .order_by(t.promotions.c.decided_at.desc())
            .limit(1)
        ).first()
        return None if row is None or row[0] is None else float(row[0])


def _resolve(key: str, ref: str, models: ModelRepo) -> ModelVersion:
    upstream, name, which = parse_input_ref(ref)
    if upstream is not None:
        made = models.for_job(upstream)
        if not made:
            raise FlowError(
                f"input {key}: job {upstream} saved no model (run.save_model), so there is "
                "nothing to read"
            )
        return models.version(made[-1].model, made[-1].version)
    assert name is not None and which is not None
    try:
        return models.resolve(name, which)
    except NotFound as exc:
        raise FlowError(f"input {key}: {exc}") from None
