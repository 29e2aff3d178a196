"""Continuing and cloning jobs: ``POST /jobs/{id}/resume`` and ``POST /jobs/{id}/clone``. The
work is :mod:`trainhouse.usecases.lineage`'s; these routes parse, call and render.

A resume sends an ended job (CANCELED or FAILED) back to the queue: the same job, its next
attempt loading its latest good checkpoint as a restart does. A clone is a new job with the same
workdir archive (no upload) and the spec with overrides; with ``from_checkpoint`` it starts from
a verified copy of one of the old job's checkpoints.
"""

from __future__ import annotations

from fastapi import APIRouter, Body, Depends

from trainhouse.core.records import Job
from trainhouse.server.auth import readable_job, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import job_out
from trainhouse.server.schemas import CloneIn, JobOut, ResumeIn
from trainhouse.usecases import lineage
from trainhouse.usecases.access import Principal
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])


@router.post("/jobs/{job_id}/resume", response_model=JobOut)
def resume(
    body: ResumeIn = Body(default_factory=ResumeIn),
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Send a CANCELED or FAILED job back to the queue, to continue from its latest good
    checkpoint: the same job, its attempts and restart counters going on (``resumes`` + 1).
    Refused (409) for a job in any other state or without a checkpoint. The reason names who
    resumed it: the token's user, or with auth off ``by`` (the client's local user; absent,
    the job's owner)."""
    return job_out(lineage.resume(rt, p, job, by=body.by), rt)


@router.post("/jobs/{job_id}/clone", response_model=JobOut, status_code=201)
async def clone(
    body: CloneIn = Body(default_factory=CloneIn),
    job: Job = Depends(readable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """A new job, owned by the caller, with the same workdir archive and the spec plus the
    overrides (``set``, as ``--set``); with ``from_checkpoint`` ('latest' or a step) it starts
    from a verified copy of that checkpoint. It records where it came from (``cloned_from``,
    ``cloned_step``). The copy runs in the server's bounded background work: 503 with
    Retry-After when that is full, 422 for a checkpoint past the server's --clone-max-bytes."""
    new = await lineage.clone(rt, p, job, overrides=body.set, from_checkpoint=body.from_checkpoint)
    return await in_thread(job_out, new, rt)
