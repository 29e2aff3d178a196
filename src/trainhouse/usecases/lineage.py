"""Continuing and cloning jobs.

A resume sends an ended job (CANCELED or FAILED) back to the queue through the lifecycle table
(``store.jobs.resume``): the same job, its next attempt loading its latest good checkpoint as a
restart does. A clone is a new job with the same workdir archive (no upload) and the spec with
overrides; with ``from_checkpoint`` it starts from a verified copy of one of the old job's
checkpoints (:meth:`trainhouse.ingest.checkpoints.Checkpoints.copy`), held out of the
scheduler's reach (``held``) until the copy is registered. Each change is one transaction with
its audit entry; the scheduler is woken after it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import orjson

from trainhouse.core.errors import (
    InvalidTransition,
    NotFound,
    ResourceError,
    ServerBusy,
    StoreError,
)
from trainhouse.core.flows import verdict
from trainhouse.core.lifecycle import RESUMABLE, JobState
from trainhouse.core.records import Checkpoint, Job
from trainhouse.usecases import audit, filework
from trainhouse.usecases.access import Principal
from trainhouse.usecases.filework import in_thread
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import accepted_spec, check_entrypoint, never_fits

__all__ = ["acting_name", "clone", "resume"]


def acting_name(p: Principal, claimed: str | None, owner: str) -> str:
    """Who a resume names as its doer: with auth on the token's user (a claim is ignored);
    with auth off the local user the client says it runs as, else the owner of what is
    resumed (the dashboard sends no name)."""
    if p.authenticated:
        return p.name
    return claimed or owner


def _loadable(rt: Runtime, job_id: int) -> list[Checkpoint]:
    """The job's checkpoints a restart may load (not deleted, not marked corrupt), by step."""
    return [c for c in rt.store.checkpoints.list(job_id) if c.corrupt is None]


def resume(rt: Runtime, p: Principal, job: Job, by: str | None = None) -> Job:
    """Send ``job`` (one the caller may write), CANCELED or FAILED, back to the queue, to
    continue from its latest good checkpoint: the same job, its attempts and restart counters
    going on (``resumes`` + 1); its reason names who resumed it (:func:`acting_name` of
    ``by``, the name a client claims). Refused (409) for a job in any other state or without a
    checkpoint, and for one that could no longer run on this server."""
    job_id = job.id
    if job.state not in RESUMABLE:
        why = {
            JobState.COMPLETED: f"it completed; `trainhouse clone {job_id} "
            "--from-checkpoint latest` trains on from its checkpoint in a new job",
        }.get(job.state, "it has not ended; only a canceled or failed job can be resumed")
        raise InvalidTransition(f"job {job_id} is {job.state}: {why}")
    upstreams = rt.store.flows.upstreams([job_id]).get(job_id)
    if upstreams and (said := verdict(upstreams)).doomed:
        again = f"trainhouse flows resume {job.flow_id}" if job.flow_id else "trainhouse resume"
        raise InvalidTransition(
            f"job {job_id} waits for a job that can no longer complete ({said.reason}): resume "
            f"that one first ({again})"
        )
    loadable = _loadable(rt, job_id)
    if not loadable:
        raise StoreError(
            f"job {job_id} has no checkpoint to resume from (it saved none, or none is left); "
            f"`trainhouse clone {job_id}` runs it again from the start"
        )
    reason = never_fits(rt, job.spec.resources)
    if reason:
        raise ResourceError(f"job {job_id} can no longer run on this server: {reason}")
    latest = max(loadable, key=lambda c: (c.step, c.id))
    with rt.store.transaction():
        resumed = rt.store.jobs.resume(
            job_id, by=acting_name(p, by, job.owner), checkpoint_step=latest.step
        )
        audit.record(rt, p, "job.resume", f"job:{job_id}", owner=job.owner, step=latest.step)
    rt.scheduler.wake()
    return resumed


def _checkpoint(rt: Runtime, source: Job, wanted: str) -> Checkpoint:
    """The checkpoint of ``source`` a clone starts from: its newest loadable one (``latest``)
    or the newest of step ``wanted``."""
    loadable = _loadable(rt, source.id)
    if not loadable:
        raise NotFound(f"job {source.id} has no checkpoint to start from")
    if wanted == "latest":
        return max(loadable, key=lambda c: (c.step, c.id))
    step = int(wanted)
    found = [c for c in loadable if c.step == step]
    if not found:
        steps = ", ".join(str(c.step) for c in loadable[-20:])
        raise NotFound(f"job {source.id} has no checkpoint of step {step}; its steps: {steps}")
    return max(found, key=lambda c: c.id)


async def clone(
    rt: Runtime,
    p: Principal,
    source: Job,
    *,
    overrides: list[str] | None = None,
    from_checkpoint: str | None = None,
) -> Job:
    """A new job, owned by the caller, with the same workdir archive as ``source`` (a job the
    caller may read) and its spec plus ``overrides`` (as ``--set``); with ``from_checkpoint``
    ('latest' or a step) it starts from a verified copy of that checkpoint, one of at most
    ``Settings.clone_max_bytes`` (refused before anything is made or read), copied in the
    server's bounded background work (:mod:`trainhouse.usecases.filework`), awaited without a
    thread. It records where it came from (``cloned_from``, ``cloned_step``). A copy that
    fails leaves no job behind."""
    new, ckpt, audited = await in_thread(_make_clone, rt, p, source, overrides, from_checkpoint)
    if ckpt is None:
        rt.scheduler.wake()
        return new

    began = threading.Event()

    def work(cancel: threading.Event) -> Job:  # the copy, then the clone released or dropped
        began.set()
        try:
            rt.checkpoints.copy(source, ckpt, new, cancel)
            with rt.store.transaction():
                rt.checkpoints.add_copy(ckpt, new)
                released = rt.store.jobs.release(new.id)
                audited(released)
        except BaseException:
            rt.checkpoints.remove_all(new.id)
            rt.store.jobs.discard(new.id)
            raise
        rt.scheduler.wake()
        return released

    what = f"copying job {source.id}'s checkpoint of step {ckpt.step}"
    try:
        return await filework.run(rt, ("clone", new.id), what, work)
    except ServerBusy:  # the pool is full (or stopping): the held clone is not left behind
        if not began.is_set():
            await in_thread(_drop_clone, rt, new.id)
        raise


def _make_clone(
    rt: Runtime,
    p: Principal,
    source: Job,
    overrides: list[str] | None,
    from_checkpoint: str | None,
) -> tuple[Job, Checkpoint | None, Callable[[Job], None]]:
    """The clone's row (held when a checkpoint is to be copied into it, audited now when
    not), the checkpoint, and what audits it."""
    text = orjson.dumps(source.spec_data).decode()
    spec = accepted_spec(rt, p, text, overrides=overrides, source=f"job {source.id}'s spec")
    archive = rt.blobs.path(source.archive_sha256)
    if not archive.is_file():
        raise NotFound(f"job {source.id}'s workdir archive is no longer on the server")
    check_entrypoint(spec, archive)
    ckpt = _checkpoint(rt, source, from_checkpoint) if from_checkpoint is not None else None
    owner = p.name if p.authenticated else source.owner
    step = ckpt.step if ckpt is not None else None
    if ckpt is not None:  # before anything is made: its bytes (a sparse file's apparent size)
        rt.checkpoints.check_copy(ckpt, source.id, max_bytes=rt.settings.clone_max_bytes)

    def audited(new: Job) -> None:  # in the transaction that makes the clone schedulable
        audit.record(
            rt,
            p,
            "job.clone",
            f"job:{new.id}",
            source=source.id,
            step=step,
            overrides=overrides or None,
        )

    with rt.store.transaction():
        new = rt.store.jobs.create(
            name=spec.name,
            owner=owner,
            priority=spec.priority,
            spec=spec,
            archive_sha256=source.archive_sha256,
            cloned_from=source.id,
            cloned_step=step,
            hold=ckpt is not None,
        )
        if ckpt is None:
            audited(new)
    return new, ckpt, audited


def _drop_clone(rt: Runtime, job_id: int) -> None:
    """A held clone whose copy never started: its files and row removed."""
    rt.checkpoints.remove_all(job_id)
    rt.store.jobs.discard(job_id)
