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
from dataclasses import dataclass, replace

from trainhouse.core.errors import InvalidMetrics, Refused
from trainhouse.core.records import Checkpoint, Job
from trainhouse.core.reports import parse_report
from trainhouse.core.tokens import hash_token
from trainhouse.scheduler.outcome import stop_reason
from trainhouse.usecases import callers
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime

PARSE_INLINE = 64 * 1024  # bytes: a bigger body is parsed in a thread, not the event loop

__all__ = [
    "PARSE_INLINE",
    "Reported",
    "in_thread",
    "mark_corrupt",
    "register_checkpoint",
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
    try:
        if len(body) <= PARSE_INLINE:  # a small body parses faster than a hop to a thread
            parsed = parse_report(body)
        else:
            parsed = await in_thread(parse_report, body)
    except InvalidMetrics:
        await in_thread(callers.reporting_job, rt, job_id, token, client)
        raise
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
        try:
            stored = await asyncio.wrap_future(rt.reports.submit(job_id, parsed, hash_token(token)))
        except Refused as refused:
            why = f"the credential is not valid for job {refused.job.id}'s current attempt"
            # counted and audited (a write): in a thread, not on the event loop
            error = await in_thread(rt.auth.refuse, client, why, token)
            raise error from None
        job, accepted = stored.job, stored.accepted
    rt.telemetry.points.inc(accepted)
    # a trial: its objective values go to the search's pruner, which may stop it now
    trial = job.search_id is not None and not job.prune_requested and len(parsed.columns) > 0
    if trial and await in_thread(rt.tune.on_report, job, parsed.columns):
        job = replace(job, prune_requested=True)
    started = None
    if job.spec.max_runtime:
        attempt = await in_thread(rt.store.jobs.attempt, job.id, job.attempts)
        started = attempt.started_at
    stop = stop_reason(job, started, time.time())
    return Reported(
        accepted=accepted, stop_reason=stop.message if stop is not None else None, job=job
    )


def register_checkpoint(
    rt: Runtime,
    job: Job,
    *,
    attempt: int,
    step: int,
    path: str,
    size: int,
    sha256: str,
    metrics: dict[str, float | None],
    kind: str,
    algorithm: str = "sha256",
) -> Checkpoint:
    """A checkpoint the SDK of ``job`` (its credential checked) finished writing, checked
    against what is in storage; retention runs after it in the background."""
    return rt.checkpoints.register(
        job,
        attempt=attempt,
        step=step,
        path=path,
        size=size,
        sha256=sha256,
        metrics=metrics,
        kind=kind,
        algorithm=algorithm,
    )


def mark_corrupt(rt: Runtime, job: Job, checkpoint_id: int, reason: str) -> Checkpoint:
    """A load found this checkpoint of ``job`` damaged (checksum mismatch, missing files): it
    is listed no more, and kept out of retention so an older good one survives."""
    return rt.checkpoints.mark_corrupt(job, checkpoint_id, reason)
