"""A job's rows: a ``jobs`` row read into a :class:`~trainhouse.core.records.Job` (and an
``attempts`` row into an Attempt), the filters every listing of jobs shares, and a new job
inserted with its ``job_hparams``, ``job_tags`` and first event (the jobs, runs, searches and
services repositories all insert jobs; this module is what they share)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, insert
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.sql.elements import ColumnElement

from trainhouse.core.cluster import placements_from_json
from trainhouse.core.lifecycle import AttemptResult, FailureKind, JobState
from trainhouse.core.records import TRACKED, Attempt, Job
from trainhouse.core.spec import JobSpec
from trainhouse.store import tables as t
from trainhouse.store.datasets import insert_pins, resolve_pins

__all__ = [
    "attempt_from_row",
    "flatten_hparams",
    "hparam_rows",
    "insert_job",
    "job_filters",
    "job_from_row",
]

MAX_HPARAM_TEXT = 256  # characters of an hparam's value kept for filtering (the JSON keeps all)
MAX_HPARAM_KEYS = 1000  # flattened keys of one job kept for filtering


def flatten_hparams(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened with dots (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``);
    lists and other values stay as they are."""
    out: dict[str, Any] = {}
    for key, value in hparams.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_hparams(value, f"{name}."))
        else:
            out[name] = value
    return out


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def hparam_rows(job_id: int, hparams: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``job_hparams`` rows of ``hparams``: per flattened key, the value as a number
    (numbers, booleans as 1 and 0; NULL otherwise) and as text (at most 256 characters)."""
    rows = []
    for key, value in list(flatten_hparams(hparams).items())[:MAX_HPARAM_KEYS]:
        if len(key) > 256:
            continue
        num = None
        if isinstance(value, bool):
            num = 1.0 if value else 0.0
        elif isinstance(value, int | float) and math.isfinite(value):
            num = float(value)
        rows.append(
            {"job_id": job_id, "key": key, "num": num, "text": _as_text(value)[:MAX_HPARAM_TEXT]}
        )
    return rows


def job_from_row(row: RowMapping) -> Job:
    return Job(
        id=row["id"],
        name=row["name"],
        owner=row["owner"],
        state=JobState(row["state"]),
        priority=row["priority"],
        spec_data=row["spec"],
        archive_sha256=row["archive_sha256"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        attempts=row["attempts"],
        restarts=row["restarts"],
        infra_restarts=row["infra_restarts"],
        exit_code=row["exit_code"],
        reason=row["reason"],
        cancel_requested=bool(row["cancel_requested"]),
        preempt_requested=bool(row["preempt_requested"]),
        token_hash=row["token_hash"],
        placement=placements_from_json(row["placement"]),
        total_steps=row["total_steps"],
        last_step=row["last_step"],
        latest_metrics=row["latest_metrics"] or {},
        kind=row["kind"],
        search_id=row["search_id"],
        prune_requested=bool(row["prune_requested"]),
        resize_requested=bool(row["resize_requested"]),
        resumes=row["resumes"],
        cloned_from=row["cloned_from"],
        cloned_step=row["cloned_step"],
        held=bool(row["held"]),
        project=row["project"],
        hparams=row["hparams"],
        note=row["note"],
        archived=bool(row["archived"]),
        flow_id=row["flow_id"],
        flow_step=row["flow_step"],
    )


def attempt_from_row(row: RowMapping) -> Attempt:
    return Attempt(
        job_id=row["job_id"],
        number=row["number"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        result=AttemptResult(row["result"]) if row["result"] else None,
        exit_code=row["exit_code"],
        rank_exit_codes=row["rank_exit_codes"],
        placement=placements_from_json(row["placement"]),
        pid=row["pid"],
        pid_create_time=row["pid_create_time"],
        reason=row["reason"],
        failure=FailureKind(row["failure"]) if row["failure"] else None,
        failed_rank=row["failed_rank"],
        log_tail=row["log_tail"],
    )


def job_filters(
    states: Iterable[JobState] | None,
    owner: str | None,
    name: str | None,
    tracked: bool | None = False,
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if tracked is not None:
        where.append((t.jobs.c.kind == TRACKED) if tracked else (t.jobs.c.kind != TRACKED))
    if states is not None:
        where.append(t.jobs.c.state.in_([str(s) for s in states]))
    if owner:
        where.append(t.jobs.c.owner == owner)
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append(func.lower(t.jobs.c.name).like(f"%{escaped.lower()}%", escape="\\"))
    return where


def insert_job(
    conn: Connection,
    *,
    name: str,
    owner: str,
    priority: str,
    spec: JobSpec | Mapping[str, Any],
    archive_sha256: str,
    search_id: int | None = None,
    cloned_from: int | None = None,
    cloned_step: int | None = None,
    hold: bool = False,
    reason: str = "submitted",
    flow_id: int | None = None,
    flow_step: str | None = None,
) -> int:
    """Insert a new QUEUED job and its first event in the caller's transaction; its id."""
    parsed = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
    stored = parsed.model_dump(mode="json")
    if stored.get("search") is None:
        stored.pop("search", None)  # a plain job's spec reads as before searches existed
    # the versions it reads, pinned now: a restart or a resume reads the same ones
    pins = resolve_pins(conn, parsed.datasets)
    if pins:
        stored["datasets"] = {p.key: p.ref for p in pins}
    else:
        stored.pop("datasets", None)
    now = time.time()
    job_id: int = conn.execute(
        insert(t.jobs)
        .values(
            name=name,
            owner=owner,
            state=JobState.QUEUED,
            priority=priority,
            spec=stored,
            archive_sha256=archive_sha256,
            created_at=now,
            updated_at=now,
            attempts=0,
            restarts=0,
            cancel_requested=False,
            reason="waiting for the scheduler",
            # columns named only when set: an insert works on an older schema too
            **({"search_id": search_id} if search_id is not None else {}),
            **({"cloned_from": cloned_from} if cloned_from is not None else {}),
            **({"cloned_step": cloned_step} if cloned_step is not None else {}),
            **({"held": True} if hold else {}),
            **({"flow_id": flow_id, "flow_step": flow_step} if flow_id is not None else {}),
            # the default project is the column's own default (the runs table's columns are
            # written only when they say something)
            **({"project": parsed.project} if parsed.project != "default" else {}),
        )
        .returning(t.jobs.c.id)
    ).scalar_one()
    insert_pins(conn, job_id, pins)
    if parsed.after:  # the jobs it waits for (the scheduler reads them at every tick)
        conn.execute(
            insert(t.job_after),
            [{"job_id": job_id, "upstream_id": a.job, "until": a.when} for a in parsed.after],
        )
    if parsed.promote is not None:  # decided when it completes
        promote = parsed.promote
        conn.execute(
            insert(t.promotions).values(
                job_id=job_id,
                alias=promote.alias,
                metric=promote.metric,
                mode=promote.mode,
                model=promote.model,
            )
        )
    rows = hparam_rows(job_id, parsed.hparams)
    if rows:
        conn.execute(insert(t.job_hparams), rows)
    if parsed.tags:
        conn.execute(insert(t.job_tags), [{"job_id": job_id, "tag": tag} for tag in parsed.tags])
    conn.execute(
        insert(t.events).values(
            job_id=job_id, at=now, from_state=None, to_state=JobState.QUEUED, reason=reason
        )
    )
    return job_id
