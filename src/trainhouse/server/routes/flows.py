"""Flows: submit (every step in one transaction), list, show, cancel, resume; and a job's own
inputs, read with its credential as its nodes stage them. The work is
:mod:`trainhouse.usecases.flows`'s; these routes parse, call and render."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, File, Form, Path, Query, UploadFile
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from trainhouse.core.errors import FlowError
from trainhouse.core.records import Job
from trainhouse.server.auth import reporting_job, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.schemas.common import NO_NUL
from trainhouse.server.schemas.flows import FlowIn, FlowListOut, FlowOut, FlowStepOut
from trainhouse.server.schemas.jobs import ResumeIn
from trainhouse.usecases import flows, jobs
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["flows"])

FlowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
Key = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
FileName = Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


def flow_out(view: flows.FlowView, rt: Runtime, p: Principal) -> FlowOut:
    """A flow with its steps' states and reasons (another user's: said from the state)."""
    summary = not (p.is_admin or view.flow.owner == p.name)
    steps = []
    for step in view.flow.steps:
        job = view.jobs.get(str(step["name"]))
        shown = jobs.view(rt, job, summary_only=summary) if job is not None else None
        steps.append(
            FlowStepOut(
                name=str(step["name"]),
                job_id=int(step["job_id"]),
                after=list(step.get("after") or []),
                inputs=dict(step.get("inputs") or {}),
                state=job.state if job is not None else None,
                reason=shown["reason"] if shown is not None else "deleted",
                job_name=job.name if job is not None else None,
                last_step=job.last_step if job is not None else None,
                total_steps=job.total_steps if job is not None else None,
            )
        )
    f = view.flow
    return FlowOut(
        id=f.id,
        name=f.name,
        owner=f.owner,
        created_at=f.created_at,
        state=view.state,
        jobs=f.jobs,
        steps=steps,
    )


@router.post("/flows", response_model=FlowOut, status_code=201)
def submit(
    flow: Annotated[str, Form(description="JSON: {name, steps: [{name, after, inputs, archive}]}")],
    spec: Annotated[list[str], Form(description="Each step's job spec (JSON or YAML), in order")],
    workdir: Annotated[list[UploadFile], File(description="The steps' workdir archives")],
    owner: Annotated[
        str,
        Form(max_length=128, pattern=NO_NUL, description="Ignored when auth is on"),
    ] = "anonymous",
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> FlowOut:
    """Every step as a job, in one transaction: all or none."""
    try:
        body = FlowIn.model_validate_json(flow)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise FlowError(f"flow: {where}: {first['msg']}") from None
    if len(spec) != len(body.steps):
        raise FlowError(f"{len(body.steps)} steps but {len(spec)} specs were sent")
    steps = [
        flows.StepIn(s.name, text, s.after, s.inputs, s.archive)
        for s, text in zip(body.steps, spec, strict=True)
    ]
    made = flows.submit(rt, p, body.name, steps, [w.file for w in workdir], owner)
    return flow_out(made, rt, p)


@router.get("/flows", response_model=FlowListOut)
def list_flows(
    mine: bool = Query(False, description="Only the caller's flows"),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**63 - 1),
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> FlowListOut:
    found, total = flows.flows(rt, p, mine=mine, limit=limit, offset=offset)
    return FlowListOut(flows=[flow_out(v, rt, p) for v in found], total=total)


@router.get("/flows/{flow_id}", response_model=FlowOut)
def show(
    flow_id: FlowId, p: Principal = Depends(signed_in), rt: Runtime = Depends(runtime)
) -> FlowOut:
    return flow_out(flows.detail(rt, p, flow_id), rt, p)


@router.post("/flows/{flow_id}/cancel", response_model=FlowOut)
def cancel(
    flow_id: FlowId, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> FlowOut:
    """Cancel every step that has not ended."""
    return flow_out(flows.cancel(rt, p, flow_id), rt, p)


@router.post("/flows/{flow_id}/resume", response_model=FlowOut)
def resume(
    flow_id: FlowId,
    body: ResumeIn = Body(default_factory=ResumeIn),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> FlowOut:
    """Run again the steps that failed or were canceled; completed steps stay. Each step's
    reason names who resumed it: the token's user, or with auth off ``by`` (the client's
    local user; absent, the flow's owner)."""
    return flow_out(flows.resume(rt, p, flow_id, by=body.by), rt, p)


@router.get("/jobs/{job_id}/inputs/{key}/manifest")
def input_manifest(
    key: Key, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> dict[str, object]:
    """The files of the model version the job resolved under ``key`` (its credential only)."""
    return {"files": flows.input_manifest(rt, job, key).to_json()}


@router.get("/jobs/{job_id}/inputs/{key}/files/{file}")
def input_file(
    key: Key, file: FileName, job: Job = Depends(reporting_job), rt: Runtime = Depends(runtime)
) -> StreamingResponse:
    """One file of that version, streamed (the node checks its sha256)."""
    return StreamingResponse(
        flows.input_bytes(rt, job, key, file), media_type="application/octet-stream"
    )
