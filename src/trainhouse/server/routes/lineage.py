"""Continuing and cloning jobs: ``POST /jobs/{id}/resume`` and ``POST /jobs/{id}/clone``.

A resume sends an ended job (CANCELED or FAILED) back to the queue through the lifecycle table
(``store.jobs.resume``): the same job, its next attempt loading its latest good checkpoint as a
restart does. A clone is a new job with the same workdir archive (no upload) and the spec with
overrides; with ``from_checkpoint`` it starts from a verified copy of one of the old job's
checkpoints (``server.checkpoints.Checkpoints.copy``), held out of the scheduler's reach
(``held``) until the copy is registered.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import APIRouter, Body, Depends, Request

from trainhouse.core.errors import InvalidTransition, NotFound, ResourceError, StoreError
from trainhouse.core.lifecycle import RESUMABLE, JobState
from trainhouse.scheduler.resources import never_fits
from trainhouse.server.auth import audit, readable_job, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import (
    check_entrypoint,
    check_priority,
    job_out,
    schedulable_spec,
)
from trainhouse.server.schemas import CloneIn, JobOut
from trainhouse.store import Checkpoint, Job
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

log = logging.getLogger(__name__)

router = APIRouter(tags=["jobs"])


def _loadable(rt: Runtime, job_id: int) -> list[Checkpoint]:
    """The job's checkpoints a restart may load (not deleted, not marked corrupt), by step."""
    return [c for c in rt.store.checkpoints.list(job_id) if c.corrupt is None]


@router.post("/jobs/{job_id}/resume", response_model=JobOut)
def resume(
    request: Request,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Send a CANCELED or FAILED job back to the queue, to continue from its latest good
    checkpoint: the same job, its attempts and restart counters going on (``resumes`` + 1).
    Refused (409) for a job in any other state or without a checkpoint."""
    job_id = job.id
    if job.state not in RESUMABLE:
        why = {
            JobState.COMPLETED: f"it completed; `trainhouse clone {job_id} "
            "--from-checkpoint latest` trains on from its checkpoint in a new job",
        }.get(job.state, "it has not ended; only a canceled or failed job can be resumed")
        raise InvalidTransition(f"job {job_id} is {job.state}: {why}")
    loadable = _loadable(rt, job_id)
    if not loadable:
        raise StoreError(
            f"job {job_id} has no checkpoint to resume from (it saved none, or none is left); "
            f"`trainhouse clone {job_id}` runs it again from the start"
        )
    executor = rt.scheduler.executor
    spec = job.spec
    reason = never_fits(executor.capacity(), spec.resources, multi_node=executor.multi_node)
    if reason:
        raise ResourceError(f"job {job_id} can no longer run on this server: {reason}")
    latest = max(loadable, key=lambda c: (c.step, c.id))
    resumed = rt.store.jobs.resume(job_id, by=p.name, checkpoint_step=latest.step)
    audit(rt, request, p, "job.resume", f"job:{job_id}", owner=job.owner, step=latest.step)
    rt.scheduler.wake()
    return job_out(resumed, rt)


@router.post("/jobs/{job_id}/clone", response_model=JobOut, status_code=201)
def clone(
    request: Request,
    body: CloneIn = Body(default_factory=CloneIn),
    job: Job = Depends(readable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """A new job, owned by the caller, with the same workdir archive and the spec plus the
    overrides (``set``, as ``--set``); with ``from_checkpoint`` ('latest' or a step) it starts
    from a verified copy of that checkpoint. It records where it came from (``cloned_from``,
    ``cloned_step``)."""
    source = job
    text = orjson.dumps(source.spec_data).decode()
    spec = schedulable_spec(text, rt, overrides=body.set, source=f"job {source.id}'s spec")
    check_priority(p, spec.priority)
    archive = rt.blobs.path(source.archive_sha256)
    if not archive.is_file():
        raise NotFound(f"job {source.id}'s workdir archive is no longer on the server")
    check_entrypoint(spec, archive)
    ckpt: Checkpoint | None = None
    if body.from_checkpoint is not None:
        loadable = _loadable(rt, source.id)
        if not loadable:
            raise NotFound(f"job {source.id} has no checkpoint to start from")
        if body.from_checkpoint == "latest":
            ckpt = max(loadable, key=lambda c: (c.step, c.id))
        else:
            step = int(body.from_checkpoint)
            found = [c for c in loadable if c.step == step]
            if not found:
                steps = ", ".join(str(c.step) for c in loadable[-20:])
                raise NotFound(
                    f"job {source.id} has no checkpoint of step {step}; its steps: {steps}"
                )
            ckpt = max(found, key=lambda c: c.id)
    owner = p.name if p.authenticated else source.owner
    new = rt.store.jobs.create(
        name=spec.name,
        owner=owner,
        priority=spec.priority,
        spec=spec,
        archive_sha256=source.archive_sha256,
        cloned_from=source.id,
        cloned_step=ckpt.step if ckpt is not None else None,
        hold=ckpt is not None,
    )
    if ckpt is not None:
        try:
            rt.checkpoints.copy(source, ckpt, new)
        except BaseException:
            rt.checkpoints.remove_all(new.id)
            rt.store.jobs.discard(new.id)
            raise
        new = rt.store.jobs.release(new.id)
    audit(
        rt,
        request,
        p,
        "job.clone",
        f"job:{new.id}",
        source=source.id,
        step=ckpt.step if ckpt is not None else None,
        overrides=body.set or None,
    )
    rt.scheduler.wake()
    return job_out(new, rt)
