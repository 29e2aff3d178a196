"""Flows: steps submitted together, each a job that waits for its upstream steps and may read
the model an upstream step saved; listed, shown, canceled whole, and resumed (only the steps
that did not complete run again, the completed steps' outputs reused).

A flow is all or nothing at submit: every step's spec is checked like a job's, every archive
stored, then every job inserted in one transaction with its ``after:`` rows (what the
scheduler holds it by) and its inputs (``job:<upstream id>``). A job's credential reads the
model versions its job resolved as inputs (:func:`input_manifest`, :func:`input_bytes`), which
its nodes stage as they stage datasets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainhouse.core.datasets import Manifest
from trainhouse.core.errors import (
    FlowError,
    Forbidden,
    InvalidTransition,
    NotFound,
    SpecError,
    StoreError,
    UploadTooLarge,
)
from trainhouse.core.flows import MAX_STEPS, check_input_key, check_step_name, order
from trainhouse.core.lifecycle import RESUMABLE, JobState
from trainhouse.core.records import Flow, Job
from trainhouse.core.spec import JobSpec
from trainhouse.jobfs.workdir import human_size
from trainhouse.store.flows import manifest_of
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.lineage import acting_name
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import (
    accepted_spec,
    check_entrypoint,
    check_promote,
    owner_of,
)

__all__ = [
    "FlowView",
    "StepIn",
    "cancel",
    "detail",
    "flows",
    "input_bytes",
    "input_manifest",
    "resume",
    "state_of",
    "submit",
]


@dataclass(frozen=True)
class StepIn:
    """One step as submitted: its spec's text, the steps it waits for, the inputs that are
    other steps' models (key -> step), and the index of its workdir archive."""

    name: str
    spec: str
    after: Sequence[str] = ()
    inputs: Mapping[str, str] | None = None
    archive: int = 0


@dataclass(frozen=True)
class FlowView:
    flow: Flow
    jobs: dict[str, Job]  # by step; a deleted step is missing
    state: str


def state_of(flow: Flow, jobs: Mapping[str, Job]) -> str:
    """RUNNING while a step runs, QUEUED while steps wait; once none is left to run,
    COMPLETED if every step did, FAILED if one failed, else CANCELED."""
    states = [jobs[s].state if s in jobs else JobState.CANCELED for s in flow.jobs]
    if any(s is JobState.RUNNING or s is JobState.RESTARTING for s in states):
        return "RUNNING"
    if any(not s.terminal for s in states):
        return "QUEUED"
    if all(s is JobState.COMPLETED for s in states):
        return "COMPLETED"
    return "FAILED" if any(s is JobState.FAILED for s in states) else "CANCELED"


def _view(rt: Runtime, flow: Flow, jobs: list[Job] | None = None) -> FlowView:
    if jobs is None:
        jobs = rt.store.flows.jobs([flow.id])[flow.id]
    by_step = {j.flow_step: j for j in jobs if j.flow_step is not None}
    return FlowView(flow, by_step, state_of(flow, by_step))


def _may_read(rt: Runtime, p: Principal, flow: Flow, *, listing: bool = False) -> bool:
    if p.is_job:
        return False
    seen = ("all", "list") if listing else ("all",)
    return p.is_admin or flow.owner == p.name or rt.settings.job_visibility in seen


def _readable(rt: Runtime, p: Principal, flow_id: int) -> Flow:
    flow = rt.store.flows.get(flow_id)
    if not _may_read(rt, p, flow):
        raise Forbidden(f"flow {flow_id} belongs to another user; {p.name!r} may not read it")
    return flow


def _writable(rt: Runtime, p: Principal, flow_id: int) -> Flow:
    flow = _readable(rt, p, flow_id)
    if not p.is_admin and flow.owner != p.name:
        raise Forbidden(f"flow {flow_id} belongs to {flow.owner}; {p.name!r} may not change it")
    return flow


def _check_steps(steps: Sequence[StepIn], archives: int) -> list[StepIn]:
    """The steps checked as a graph (names, known upstreams, inputs from upstreams, no
    cycle), upstreams first."""
    if not steps:
        raise FlowError("a flow has at least one step")
    if len(steps) > MAX_STEPS:
        raise FlowError(f"a flow has at most {MAX_STEPS} steps, got {len(steps)}")
    by_name: dict[str, StepIn] = {}
    for step in steps:
        check_step_name(step.name)
        if step.name in by_name:
            raise FlowError(f"step {step.name!r} is given twice")
        by_name[step.name] = step
        if not 0 <= step.archive < archives:
            raise FlowError(f"step {step.name!r}: archive {step.archive} was not uploaded")
    ups: dict[str, list[str]] = {}
    for step in steps:
        wanted = list(dict.fromkeys(step.after))
        for key, upstream in (step.inputs or {}).items():
            check_input_key(key)
            if upstream not in by_name:
                raise FlowError(f"step {step.name!r}: inputs.{key} names {upstream!r}, not a step")
            if upstream not in wanted:
                wanted.append(upstream)
        ups[step.name] = wanted
    return [
        StepIn(s.name, s.spec, tuple(ups[s.name]), dict(s.inputs or {}), s.archive)
        for s in (by_name[n] for n in order(ups))
    ]


def submit(
    rt: Runtime,
    p: Principal,
    name: str,
    steps: Sequence[StepIn],
    archives: Sequence[BinaryIO],
    owner: str,
) -> FlowView:
    """Every step as a job, in one transaction: all or none."""
    if not name or len(name) > 128 or "\x00" in name:
        raise FlowError("a flow's name is 1-128 characters")
    ordered = _check_steps(steps, len(archives))
    specs: dict[str, JobSpec] = {}
    for step in ordered:
        spec = accepted_spec(rt, p, step.spec, source=f"step {step.name}", flow_step=True)
        if spec.search is not None:
            raise SpecError(f"step {step.name}: a step is a job, not a search (no search: block)")
        specs[step.name] = spec
    digests: dict[int, str] = {}
    for index in sorted({s.archive for s in ordered}):
        users = [specs[s.name] for s in ordered if s.archive == index]

        def validate(archive: Path, users: list[JobSpec] = users) -> None:
            for spec in users:
                check_entrypoint(spec, archive)

        try:
            digests[index], _ = rt.blobs.put(
                archives[index], rt.settings.max_upload_bytes, validate
            )
        except ValueError:
            raise UploadTooLarge(
                f"workdir archive {index} is larger than {human_size(rt.settings.max_upload_bytes)}"
            ) from None
    made_by = owner_of(p, owner)
    with rt.store.transaction() as conn:
        flow_id = rt.store.flows.create(conn, name=name, owner=made_by)
        ids: dict[str, int] = {}
        recorded: list[dict[str, Any]] = []
        for step in ordered:
            data = specs[step.name].model_dump(mode="json")
            data["after"] = [*data.get("after", []), *({"job": ids[u]} for u in step.after)]
            data["inputs"] = {
                **data.get("inputs", {}),
                **{k: f"job:{ids[s]}" for k, s in (step.inputs or {}).items()},
            }
            spec = JobSpec.model_validate(data)
            try:
                check_promote(rt, spec)
            except FlowError as exc:
                raise FlowError(f"step {step.name}: {exc}") from None
            job = rt.store.jobs.create(
                name=spec.name,
                owner=made_by,
                priority=spec.priority,
                spec=spec,
                archive_sha256=digests[step.archive],
                flow_id=flow_id,
                flow_step=step.name,
            )
            ids[step.name] = job.id
            recorded.append(
                {
                    "name": step.name,
                    "job_id": job.id,
                    "after": list(step.after),
                    "inputs": dict(step.inputs or {}),
                }
            )
        rt.store.flows.set_steps(conn, flow_id, recorded)
        audit.record(rt, p, "flow.submit", f"flow:{flow_id}", name=name, jobs=ids)
    rt.scheduler.wake()
    return _view(rt, rt.store.flows.get(flow_id))


def flows(
    rt: Runtime, p: Principal, *, mine: bool = False, limit: int = 100, offset: int = 0
) -> tuple[list[FlowView], int]:
    """A page of the flows the caller may see, newest first, and how many there are."""
    see_all = (p.is_admin or rt.settings.job_visibility in ("all", "list")) and not mine
    owner = None if see_all else p.name
    found = rt.store.flows.list(owner=owner, limit=limit, offset=offset)
    jobs = rt.store.flows.jobs(f.id for f in found)
    return [_view(rt, f, jobs[f.id]) for f in found], rt.store.flows.count(owner=owner)


def detail(rt: Runtime, p: Principal, flow_id: int) -> FlowView:
    return _view(rt, _readable(rt, p, flow_id))


def cancel(rt: Runtime, p: Principal, flow_id: int) -> FlowView:
    """Cancel every step not ended yet (queued ones end now, running ones once stopped)."""
    flow = _writable(rt, p, flow_id)
    view = _view(rt, flow)
    live = [j for j in view.jobs.values() if not j.state.terminal]
    if not live:
        raise StoreError(f"flow {flow_id} has ended ({view.state}); nothing to cancel")
    with rt.store.transaction():
        for job in live:
            rt.store.jobs.cancel(job.id)
        audit.record(rt, p, "flow.cancel", f"flow:{flow_id}", jobs=[j.id for j in live])
    rt.scheduler.wake()
    return _view(rt, flow)


def resume(rt: Runtime, p: Principal, flow_id: int, by: str | None = None) -> FlowView:
    """Run again the steps that did not complete (each from its latest checkpoint, or from the
    start), in one transaction; the completed steps and their models stay as they are. Each
    step's reason names who resumed it (:func:`~trainhouse.usecases.lineage.acting_name` of
    ``by``, the name a client claims)."""
    flow = _writable(rt, p, flow_id)
    view = _view(rt, flow)
    missing = [s for s in flow.jobs if s not in view.jobs]
    if missing:
        raise StoreError(
            f"flow {flow_id} cannot be resumed: step(s) {', '.join(missing)} were deleted"
        )
    again = [j for j in view.jobs.values() if j.state in RESUMABLE]
    if not again:
        raise InvalidTransition(
            f"flow {flow_id} is {view.state}: no step failed or was canceled, nothing to resume"
        )
    doer = acting_name(p, by, flow.owner)
    with rt.store.transaction():
        for job in again:
            loadable = [c for c in rt.store.checkpoints.list(job.id) if c.corrupt is None]
            step = max((c.step for c in loadable), default=None)
            rt.store.jobs.resume(job.id, by=doer, checkpoint_step=step)
        audit.record(rt, p, "flow.resume", f"flow:{flow_id}", jobs=[j.id for j in again])
    rt.scheduler.wake()
    return _view(rt, flow)


# -- a job's own inputs (its credential) --------------------------------------------------
def _pinned(rt: Runtime, job: Job, key: str) -> Any:
    for pin in rt.store.flows.inputs(job.id):
        if pin.key == key:
            version = rt.store.models.version(pin.model, pin.version)
            if manifest_of(version).digest != pin.digest:
                raise StoreError(f"input {key}: {pin.version_ref} changed since it was resolved")
            return version
    raise NotFound(f"job {job.id} has no input {key!r} resolved")


def input_manifest(rt: Runtime, job: Job, key: str) -> Manifest:
    """The files of the version ``job`` resolved under input ``key``."""
    return manifest_of(_pinned(rt, job, key))


def input_bytes(rt: Runtime, job: Job, key: str, file: str) -> Iterator[bytes]:
    version = _pinned(rt, job, key)
    if file not in {str(f["name"]) for f in version.files}:
        raise NotFound(f"input {key}: {version.model}@{version.version} has no file {file!r}")
    return rt.saved_models.read(version, file)
