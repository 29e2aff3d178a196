"""What the SDK inside a job reports: metric batches with a heartbeat, new checkpoints, and
checkpoints a load found damaged.

Each needs the job's per-attempt credential (:func:`trainhouse.usecases.callers.reporting_job`):
a training script can report to its own job only. A metric report is stored by the group
commit writer (:mod:`trainhouse.ingest.groupcommit`), many reports in one transaction, which
checks the credential too; the answer says whether the attempt should stop. Nothing here is
audited but a refused credential (:meth:`trainhouse.usecases.access.Authenticator.refuse`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import Connection

from trainhouse.core.errors import CheckpointError, InvalidMetrics, Refused
from trainhouse.core.records import Checkpoint, Job
from trainhouse.core.reports import Report, parse_report
from trainhouse.core.tokens import hash_token
from trainhouse.ingest.groupcommit import Stored, Then
from trainhouse.scheduler.outcome import stop_reason
from trainhouse.usecases import callers
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime

PARSE_INLINE = 64 * 1024  # bytes: a bigger body is parsed in a thread, not the event loop

__all__ = [
    "PARSE_INLINE",
    "Registered",
    "Registration",
    "Reported",
    "in_thread",
    "mark_corrupt",
    "register",
    "report",
]


@dataclass(frozen=True)
class Reported:
    """A report stored: the points written (0 for a batch id seen before), why the attempt
    must stop now (None: it goes on), and the job whose credential it carried."""

    accepted: int
    stop_reason: str | None
    job: Job


async def report(rt: Runtime, job_id: int, body: bytes, token: str | None, client: str) -> Reported:
    """One flush of the SDK's metric buffer (a ``ReportIn``, up to 200,000 points, parsed by
    hand: :func:`trainhouse.core.reports.parse_report`) and heartbeat for ``job_id``, sent
    with ``token`` from ``client``. It returns once the points are committed: with group
    commit, in one transaction for many reports, which checks the credential too (a refused
    one is counted and audited as any); without it (``report_group_commit`` off) or without
    a credential, one transaction per report in a worker thread. A malformed body is refused
    after the credential is checked: a stranger learns no rules. A search's trial hands its
    objective values to the search's pruner, which may stop it now. Raises ``ServerBusy``
    (503, Retry-After) when the server has too many points queued."""
    parsed = await _parsed(rt, job_id, body, len(body), token, client)
    return await _report(rt, job_id, parsed, token, client)


async def _parsed(
    rt: Runtime,
    job_id: int,
    body: bytes | dict[str, Any],
    size: int,
    token: str | None,
    client: str,
) -> Report:
    """``body`` (of ``size`` bytes as JSON) checked as a report; InvalidMetrics once the
    credential is checked (a stranger learns no rules)."""
    try:
        if size <= PARSE_INLINE:  # a small body parses faster than a hop to a thread
            return parse_report(body)
        return await in_thread(parse_report, body)
    except InvalidMetrics:
        await in_thread(callers.reporting_job, rt, job_id, token, client)
        raise


async def _report(
    rt: Runtime, job_id: int, parsed: Report, token: str | None, client: str
) -> Reported:
    if token is None or not rt.settings.report_group_commit:
        # no credential (refused as reporting_job refuses it), or one transaction per report
        # in a worker thread as before group commit (bench/load.py's baseline)
        job = await in_thread(callers.reporting_job, rt, job_id, token, client)
        resume = parsed.resume_step
        accepted = await in_thread(
            rt.store.metrics.add,
            job.id,
            parsed.columns,
            batch_id=parsed.batch_id,
            total_steps=parsed.total_steps,
            resume=(parsed.attempt, resume) if resume is not None else None,
        )
    else:
        stored = await _submit(rt, job_id, parsed, token, client)
        job, accepted = stored.job, stored.accepted
    return await _outcome(rt, job, parsed, accepted)


async def _submit(
    rt: Runtime,
    job_id: int,
    parsed: Report | None,
    token: str,
    client: str,
    then: Then | None = None,
) -> Stored:
    """``parsed`` (None: no points) and ``then`` stored by the group commit writer, which
    checks the credential; a refused one is counted and audited as any."""
    try:
        return await asyncio.wrap_future(
            rt.reports.submit(job_id, parsed, hash_token(token), then=then)
        )
    except Refused as refused:
        why = f"the credential is not valid for job {refused.job.id}'s current attempt"
        # counted and audited (a write): in a thread, not on the event loop
        error = await in_thread(rt.auth.refuse, client, why, token)
        raise error from None


async def _outcome(rt: Runtime, job: Job, parsed: Report, accepted: int) -> Reported:
    """What a stored report answers: should the attempt stop now?"""
    rt.telemetry.points.inc(accepted)
    # a trial: its objective values go to the search's pruner, which may stop it now
    trial = job.search_id is not None and not job.prune_requested and len(parsed.columns) > 0
    if trial and await in_thread(rt.tune.on_report, job, parsed.columns):
        job = replace(job, prune_requested=True)
    started = None
    if job.max_runtime:
        attempt = await in_thread(rt.store.jobs.attempt, job.id, job.attempts)
        started = attempt.started_at
    stop = stop_reason(job, started, time.time())
    return Reported(
        accepted=accepted, stop_reason=stop.message if stop is not None else None, job=job
    )


@dataclass(frozen=True)
class Registration:
    """A checkpoint the SDK finished writing, as it reports it (``CheckpointIn`` but its
    report)."""

    attempt: int
    step: int
    path: str
    size: int
    sha256: str
    metrics: dict[str, float | None]
    kind: str = "file"
    algorithm: str = "sha256"


@dataclass(frozen=True)
class Registered:
    """A checkpoint registered, and the answer to the report it carried (None without)."""

    checkpoint: Checkpoint
    report: Reported | None


async def register(
    rt: Runtime,
    job_id: int,
    checkpoint: Registration,
    report: Report | bytes | None,
    token: str | None,
    client: str,
) -> Registered:
    """``POST /jobs/{id}/checkpoints``: a checkpoint of ``job_id`` the SDK finished writing,
    with ``report`` (the points logged before it: checked, or its JSON) stored first;
    retention runs after it in the background.

    With group commit and a credential, the credential check, the points, the check of the
    checkpoint in storage (a local one: a few system calls) and its record are ONE
    transaction of the group commit writer (:meth:`trainhouse.ingest.groupcommit.ReportWriter
    .submit`'s ``then``): the points are durable no later than the record, and never is a
    record committed without them. A checkpoint storage refuses (missing, of another size or
    kind, a link) is a CheckpointError once the points are committed, as it was when they
    were a transaction of their own. Otherwise (no credential, group commit off, an fsspec
    storage, whose checks may take a network's time) the points are stored as a report, then
    the checkpoint registered in a worker thread."""
    parsed = (
        await _parsed(rt, job_id, report, len(report), token, client)
        if isinstance(report, bytes)
        else report
    )
    fields = asdict(checkpoint)
    if token is None or not rt.settings.report_group_commit or not rt.checkpoints.local:
        reported = None
        if parsed is not None:
            reported = await _report(rt, job_id, parsed, token, client)
            job = reported.job  # the report's credential checked: the job it carried
        else:
            job = await in_thread(callers.reporting_job, rt, job_id, token, client)
        ckpt = await in_thread(rt.checkpoints.register, job, **fields)
        return Registered(ckpt, reported)

    def record(_conn: Connection, job: Job) -> Checkpoint | CheckpointError:
        try:  # in the writer's transaction, after the points: the record joins it
            return rt.checkpoints.record(job, **fields)
        except CheckpointError as exc:  # refused, the points committed all the same
            return exc

    stored = await _submit(rt, job_id, parsed, token, client, record)
    reported = None
    if parsed is not None:
        reported = await _outcome(rt, stored.job, parsed, stored.accepted)
    if isinstance(stored.then, CheckpointError):
        raise stored.then
    rt.checkpoints.collect_later(stored.job.id)  # once the record is committed
    return Registered(stored.then, reported)


def mark_corrupt(rt: Runtime, job: Job, checkpoint_id: int, reason: str) -> Checkpoint:
    """A load found this checkpoint of ``job`` damaged (checksum mismatch, missing files): it
    is listed no more, and kept out of retention so an older good one survives."""
    return rt.checkpoints.mark_corrupt(job, checkpoint_id, reason)
