"""The runs table's writes and helpers: tags, notes, projects, archiving, deleting a job, the
columns a table can show, the hparams a run reports it used (with the spec's keys it never
reads), and the compare page's numbers (``GET /runs/compare``). The work is
:mod:`trainhouse.usecases.runs`'s; these routes parse, call and render.

The list itself is ``GET /jobs`` (:mod:`trainhouse.server.routes.jobs`) with ``where``,
``columns``, ``sort``, ``project``, ``tag`` and ``archived``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from trainhouse.core.errors import InvalidQuery
from trainhouse.core.records import Job
from trainhouse.core.reports import INT64
from trainhouse.server.auth import caller, reporting_job, signed_in, writable_job, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import job_out
from trainhouse.server.schemas import (
    ArchiveIn,
    CompareOut,
    DeletedOut,
    HparamsIn,
    HparamsOut,
    JobOut,
    NoteIn,
    ProjectIn,
    RunColumnsOut,
    TagsIn,
    TagsOut,
)
from trainhouse.usecases import runs
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["runs"])


@router.get("/runs/columns", response_model=RunColumnsOut)
def run_columns(p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)) -> RunColumnsOut:
    """What the runs table can show: hparam keys and metric series jobs have (the most common
    first; with ``--job-visibility list``, from the caller's own jobs unless an admin), the
    projects and the tags."""
    return RunColumnsOut(**runs.columns(rt, p))


@router.get("/runs/compare", response_model=CompareOut)
def compare(
    ids: str = Query(
        ..., max_length=1000, description="The jobs, by id, comma-separated (at most 50)"
    ),
    last: int = Query(
        runs.DEFAULT_LAST, ge=1, le=runs.MAX_LAST, description="The points last_mean is of"
    ),
    p: Principal = Depends(caller),
    rt: Runtime = Depends(runtime),
) -> CompareOut:
    """Each job's own series in numbers, per metric: the final value, the best (by the
    metric's goal: a search's or ``checkpoints.metric``'s mode, else its name's: loss -> min,
    accuracy -> max; ``goal_from`` says which), the smallest, the largest, and the mean of the
    last ``last`` points."""
    try:
        job_ids = [int(i) for i in ids.replace(" ", "").split(",") if i]
    except ValueError:
        raise InvalidQuery(f"ids must be job ids separated by commas, not {ids!r}") from None
    if any(not 1 <= i <= INT64 for i in job_ids):
        raise InvalidQuery("job ids are positive integers")
    return CompareOut(**runs.compare(rt, p, job_ids, last=last))


@router.post("/jobs/{job_id}/tags", response_model=TagsOut)
def change_tags(
    body: TagsIn,
    job: Job = Depends(writable_job),
    rt: Runtime = Depends(runtime),
) -> TagsOut:
    """Add and remove tags (the owner or an admin)."""
    return TagsOut(job_id=job.id, tags=runs.change_tags(rt, job, add=body.add, remove=body.remove))


@router.put("/jobs/{job_id}/note", response_model=JobOut)
def set_note(
    body: NoteIn,
    job: Job = Depends(writable_job),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Replace the job's note (markdown; an empty one clears it)."""
    return job_out(runs.set_note(rt, job, body.note), rt)


@router.put("/jobs/{job_id}/project", response_model=JobOut)
def set_project(
    body: ProjectIn,
    job: Job = Depends(writable_job),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Move the job to another project (the owner or an admin; its spec keeps the project it
    was submitted with)."""
    return job_out(runs.set_project(rt, job, body.project), rt)


@router.post("/jobs/{job_id}/archive", response_model=JobOut)
def archive(
    body: ArchiveIn,
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> JobOut:
    """Archive an ended job (kept, left out of the default list), or bring it back."""
    return job_out(runs.archive(rt, p, job, body.archived), rt)


@router.delete("/jobs/{job_id}", response_model=DeletedOut)
def delete_job(
    job: Job = Depends(writable_job),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
    with_models: bool = Query(
        False, description="Also delete the model versions it registered (refused without)"
    ),
) -> DeletedOut:
    """Delete an ended job for good: its files (logs, checkpoints, also under
    ``--checkpoint-url``) and every row of it (the owner or an admin). A job not ended is
    refused: cancel it first. A job that registered model versions is refused (409, naming
    them) unless ``with_models`` deletes them too."""
    deleted = runs.delete(rt, p, job, with_models=with_models)
    return DeletedOut(job_id=deleted.job_id, rows=deleted.rows, bytes_freed=deleted.bytes_freed)


@router.post("/jobs/{job_id}/hparams", response_model=HparamsOut)
def report_hparams(
    body: HparamsIn,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> HparamsOut:
    """What the SDK reports at ``init()`` and on ``run.set_hparams``: the hparams the run uses
    now (the job's credential). A key the spec (or ``--set``) gave that the script does not
    declare among its defaults is noted once as an event, with the closest declared key."""
    found = runs.report_hparams(rt, job, body.hparams, body.script_keys)
    return HparamsOut(job_id=job.id, unread=found.unread, warnings=found.warnings)
