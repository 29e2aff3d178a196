"""The runs table's writes and helpers: tags, notes, archiving, deleting a job, the columns a
table can show, and the hparams a run reports it used (with the spec's keys it never reads).

The list itself is ``GET /jobs`` (:mod:`trainhouse.server.routes.jobs`) with ``where``,
``columns``, ``sort``, ``project``, ``tag`` and ``archived``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from fastapi import APIRouter, Depends, Request

from trainhouse.core.errors import InvalidQuery, StoreError
from trainhouse.core.runquery import suggest
from trainhouse.core.spec import MAX_HPARAMS_BYTES, check_tags
from trainhouse.jobfs import jobfiles
from trainhouse.server.auth import audit, reporting_job, signed_in, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import job_out
from trainhouse.server.schemas import (
    ArchiveIn,
    DeletedOut,
    HparamsIn,
    HparamsOut,
    JobOut,
    NoteIn,
    RunColumnsOut,
    TagsIn,
    TagsOut,
)
from trainhouse.store import Job
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["runs"])
log = logging.getLogger(__name__)


@router.get("/runs/columns", response_model=RunColumnsOut)
def run_columns(p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> RunColumnsOut:
    """What the runs table can show: hparam keys and metric series jobs have (the most common
    first; with ``--job-visibility list``, from the caller's own jobs unless an admin), the
    projects and the tags."""
    visibility = rt.settings.job_visibility
    private = None if p.is_admin or visibility == "all" else p.name
    return RunColumnsOut(**rt.store.runs.names(private=private))


@router.post("/jobs/{job_id}/tags", response_model=TagsOut)
def change_tags(
    body: TagsIn,
    job: Job = Depends(writable_job),
    rt: Runtime = Depends(runtime),
) -> TagsOut:
    """Add and remove tags (the owner or an admin)."""
    try:
        add = check_tags(body.add)
        remove = check_tags(body.remove)
    except ValueError as e:
        raise InvalidQuery(str(e)) from None
    return TagsOut(job_id=job.id, tags=rt.store.runs.change_tags(job.id, add=add, remove=remove))


@router.put("/jobs/{job_id}/note", response_model=JobOut)
def set_note(
    body: NoteIn,
    job: Job = Depends(writable_job),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Replace the job's note (markdown; an empty one clears it)."""
    rt.store.runs.set_note(job.id, body.note)
    return job_out(rt.store.jobs.get(job.id), rt)


@router.post("/jobs/{job_id}/archive", response_model=JobOut)
def archive(
    request: Request,
    body: ArchiveIn,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Archive an ended job (kept, left out of the default list), or bring it back."""
    if body.archived and not job.state.terminal:
        raise StoreError(f"job {job.id} is {job.state}: only an ended job can be archived")
    rt.store.runs.set_archived(job.id, body.archived)
    action = "job.archive" if body.archived else "job.unarchive"
    audit(rt, request, p, action, f"job:{job.id}", owner=job.owner, name=job.name)
    return job_out(rt.store.jobs.get(job.id), rt)


def _tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (no link followed)."""
    total = 0
    for top, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


@router.delete("/jobs/{job_id}", response_model=DeletedOut)
def delete_job(
    request: Request,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> DeletedOut:
    """Delete an ended job for good: its files (logs, checkpoints, also under
    ``--checkpoint-url``) and every row of it (the owner or an admin). A job not ended is
    refused: cancel it first."""
    if not job.state.terminal:
        raise StoreError(
            f"job {job.id} is {job.state}: only an ended job can be deleted (cancel it first)"
        )
    files = rt.files(job.id)
    freed = _tree_size(files.root) if files.root.is_dir() else 0
    if rt.checkpoints.base is not None:  # checkpoints kept apart from the job's directory
        storage = rt.checkpoints.storage(job.id)
        with contextlib.suppress(OSError, FileNotFoundError):
            freed += storage.size("")
        for name in storage.list(""):
            try:
                storage.delete(name)
            except OSError as exc:
                log.warning("job %s: checkpoint file %s not deleted: %s", job.id, name, exc)
    rows = rt.store.runs.delete(job.id)
    jobfiles.remove(rt.settings.home, files.root)
    audit(rt, request, p, "job.delete", f"job:{job.id}", owner=job.owner, name=job.name)
    return DeletedOut(job_id=job.id, rows=rows, bytes_freed=freed)


@router.post("/jobs/{job_id}/hparams", response_model=HparamsOut)
def report_hparams(
    body: HparamsIn,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> HparamsOut:
    """What the SDK reports at ``init()`` and on ``run.set_hparams``: the hparams the run uses
    now (the job's credential). A key the spec (or ``--set``) gave that the script does not
    declare among its defaults is noted once as an event, with the closest declared key."""
    import json

    try:
        size = len(json.dumps(body.hparams, allow_nan=False, default=str))
    except (ValueError, RecursionError) as e:
        raise InvalidQuery(f"hparams must be plain JSON values ({e})") from None
    if size > MAX_HPARAMS_BYTES:
        raise InvalidQuery(
            f"hparams must be at most {MAX_HPARAMS_BYTES // 1024} KiB as JSON, got {size} bytes"
        )
    rt.store.runs.set_hparams(job.id, body.hparams)
    unread: list[str] = []
    warnings: list[str] = []
    if body.script_keys:
        declared = sorted(set(body.script_keys))
        unread = [k for k in job.spec.hparams if k not in declared]
        for key in unread:
            warnings.append(
                f"warning: hparams.{key} was set but the script's hparams are: "
                f"{', '.join(declared[:20])}{', ...' if len(declared) > 20 else ''}"
                f"{suggest(key, declared)}"
            )
        seen = {e.reason for e in rt.store.jobs.events(job.id)}
        for text in warnings:
            if text not in seen:  # once, not at every attempt
                rt.store.jobs.add_event(job.id, text)
    return HparamsOut(job_id=job.id, unread=unread, warnings=warnings)
