"""What the SDK inside a job reports: metric batches with a heartbeat, and new checkpoints.
The work is :mod:`trainhouse.usecases.reports`'s; these routes parse, call and render.

Both need the job's per-attempt credential; a training script can report to its own job only.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.records import Job
from trainhouse.server.auth import AuthHeader, bearer_token, client_address, reporting_job
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import (
    CheckpointIn,
    CheckpointOut,
    CheckpointRegisteredOut,
    CorruptIn,
    ReportIn,
    ReportOut,
    RowId,
)
from trainhouse.usecases import reports
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["report"])

# the body is ReportIn, parsed by hand (trainhouse.core.reports.parse_report): pydantic would
# build and validate a Python object per point, several times slower than storing them
_REPORT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ReportIn.model_json_schema()}},
    }
}


async def raw_body(request: Request) -> bytes:
    return await request.body()


@router.post("/jobs/{job_id}/report", response_model=ReportOut, openapi_extra=_REPORT_BODY)
async def report(
    job_id: RowId,
    request: Request,
    authorization: str | None = AuthHeader,
    body: bytes = Depends(raw_body),
    rt: Runtime = Depends(runtime),
) -> ReportOut:
    """One flush of the SDK's metric buffer (a ReportIn, up to 200,000 points) and heartbeat;
    the answer says whether the job should stop. It comes once the points are committed: with
    many reports at once, in one transaction for many (trainhouse.ingest.groupcommit), which
    checks the job's credential too; 503 with Retry-After when the server has too many points
    queued."""
    stored = await reports.report(
        rt, job_id, body, bearer_token(authorization), client_address(request)
    )
    return ReportOut(
        accepted=stored.accepted,
        stop=stored.stop_reason is not None,
        stop_reason=stored.stop_reason,
    )


@router.post("/jobs/{job_id}/checkpoints", response_model=CheckpointRegisteredOut, status_code=201)
async def register_checkpoint(
    job_id: RowId,
    body: CheckpointIn,
    request: Request,
    authorization: str | None = AuthHeader,
    rt: Runtime = Depends(runtime),
) -> CheckpointRegisteredOut:
    """A checkpoint the SDK finished writing; retention runs after it in the background.
    With ``report`` (the points logged before it), they are stored first, as
    ``POST /jobs/{id}/report`` stores them (with group commit, in the same transaction as the
    checkpoint's record), and the answer carries that report's answer.

    Its requests are answered ahead of this route (:mod:`trainhouse.server.registrations`);
    it answers those the lean path leaves to it: a body this route's validation refuses, or
    any request when the lean path is off."""
    raw = None
    if body.report is not None:
        try:  # the route parsed it as JSON: back to bytes for the report's own parser
            raw = orjson.dumps(body.report)
        except (TypeError, ValueError, RecursionError):  # nested past what orjson writes
            raise InvalidMetrics("the report is not a metric report") from None
    fields = body.model_dump(exclude={"report"})
    done = await reports.register(
        rt,
        job_id,
        reports.Registration(**fields),
        raw,
        bearer_token(authorization),
        client_address(request),
    )
    return registered_out(done)


def registered_out(done: reports.Registered) -> CheckpointRegisteredOut:
    answer = None
    if done.report is not None:
        why = done.report.stop_reason
        answer = ReportOut(accepted=done.report.accepted, stop=why is not None, stop_reason=why)
    return CheckpointRegisteredOut(**asdict(done.checkpoint), report=answer)


@router.post("/jobs/{job_id}/checkpoints/{checkpoint_id}/corrupt", response_model=CheckpointOut)
def report_corrupt(
    checkpoint_id: RowId,
    body: CorruptIn,
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> CheckpointOut:
    """A load found this checkpoint damaged (checksum mismatch, missing files); it is listed
    no more, and kept out of retention so an older good one survives."""
    return CheckpointOut(**asdict(reports.mark_corrupt(rt, job, checkpoint_id, body.reason)))
