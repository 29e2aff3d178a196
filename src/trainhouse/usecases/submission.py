"""What every submit path checks before a job exists (a job, a search, a service's job, a
dry run, a clone): the spec parses and could ever run here, its priority is the caller's to
set, its workdir archive holds its entrypoint, and who owns what it makes."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from trainhouse.core.errors import (
    ArchiveError,
    FlowError,
    Forbidden,
    NotFound,
    ResourceError,
    UploadTooLarge,
)
from trainhouse.core.flows import parse_input_ref
from trainhouse.core.lifecycle import RESUMABLE
from trainhouse.core.spec import PRIORITY_TIERS, JobSpec, Resources, parse_spec
from trainhouse.ingest import promotions
from trainhouse.jobfs.workdir import human_size, list_members
from trainhouse.scheduler import capacity
from trainhouse.usecases.access import Principal
from trainhouse.usecases.callers import readable_job
from trainhouse.usecases.runtime import Runtime


def schedulable_spec(
    rt: Runtime, text: str, *, overrides: list[str] | None = None, source: str = "spec"
) -> JobSpec:
    """Parse a submitted spec (with ``--set`` overrides) and refuse a job that could never
    run on this server."""
    job_spec = parse_spec(text, source=source, overrides=overrides)
    reason = never_fits(rt, job_spec.resources)
    if reason is None and job_spec.resources.max_nodes > 1 and not rt.settings.shared_checkpoints:
        reason = (
            f"resources.nodes is {job_spec.resources.nodes}, but checkpoints are stored on the "
            "server's own disk (HOME/jobs/<id>/checkpoints), which the other nodes do not "
            "reach; start the server with --checkpoint-url (a directory every node mounts, or "
            "an fsspec URL such as s3://bucket/prefix), or with --shared-home if every node "
            "mounts HOME at the same path"
        )
    if reason:
        raise ResourceError(f"job can never run on this server: {reason}")
    return job_spec


def never_fits(rt: Runtime, res: Resources) -> str | None:
    """Why ``res`` could never run here, even on an idle cluster grown as far as its
    autoscaler may (an executor with ``launchable()`` names the node types it can add)."""
    executor = rt.scheduler.executor
    launchable = getattr(executor, "launchable", None)
    types = launchable()[0] if callable(launchable) else []
    # the inventory, busy or not (nodes() is what is free right now)
    return capacity.never_fits(executor.capacity(), types, res, multi_node=executor.multi_node)


def accepted_spec(
    rt: Runtime,
    p: Principal,
    text: str,
    *,
    overrides: list[str] | None = None,
    source: str = "spec",
    flow_step: bool = False,
) -> JobSpec:
    """A spec that could run here, at a priority ``p`` may set (``flow_step``: a flow's step,
    whose inputs from other steps are added once the flow's jobs exist)."""
    job_spec = schedulable_spec(rt, text, overrides=overrides, source=source)
    check_priority(p, job_spec.priority)
    check_links(rt, p, job_spec)
    if not flow_step:
        check_promote(rt, job_spec)
    return job_spec


def check_promote(rt: Runtime, job_spec: JobSpec) -> None:
    """``promote.input`` names one of the job's inputs; and where the model is known now (its
    ``model:``, or the registered version an input names) and a version holds the alias, that
    version has a value of the metric to compare with."""
    promote = job_spec.promote
    if promote is None:
        return
    model = promote.model
    if promote.input is not None:
        if promote.input not in job_spec.inputs:
            known = ", ".join(sorted(job_spec.inputs)) or "none"
            raise FlowError(
                f"promote.input {promote.input!r} is not one of the job's inputs ({known}): give "
                f"it with inputs: {{{promote.input}: NAME@VERSION}} or --set "
                f"inputs.{promote.input}=NAME@VERSION"
            )
        upstream, name, _ = parse_input_ref(job_spec.inputs[promote.input])
        if upstream is not None:
            made = rt.store.models.for_job(upstream)
            name = made[-1].model if made else None
        model = name
    if model is None:
        return
    try:
        holder = rt.store.models.get(model).aliases.get(promote.alias)
    except NotFound:
        return  # a model made later: nothing holds the alias yet
    if holder is None:
        return
    with rt.store.connect() as conn:
        value = promotions.held_value(rt.store, conn, model, holder, promote.alias, promote.metric)
    if value is None:
        have = ", ".join(sorted(rt.store.models.version(model, holder).metrics)) or "none"
        raise FlowError(
            f"promote: {model}@{promote.alias} is v{holder}, which has no value of "
            f"{promote.metric} to compare with (its metrics: {have}); promote by a metric it has, "
            f"or move the alias by hand first (trainhouse models alias {model} VERSION "
            f"{promote.alias})"
        )


def check_links(rt: Runtime, p: Principal, job_spec: JobSpec) -> None:
    """The jobs a spec waits for (``after:``) and reads models of (``inputs: {k: job:N}``)
    exist and are ``p``'s to read (403 otherwise: nobody learns another user's job's state
    by waiting on it); one that ended in a way that can never satisfy it is refused."""
    for after in job_spec.after:
        upstream = readable_job(rt, p, after.job)
        if after.when == "completed" and upstream.state in RESUMABLE:
            raise FlowError(
                f"after: job {after.job} is {upstream.state}: it can no longer complete (resume "
                "it first, or wait for any end with {job: " + str(after.job) + ", when: ended})"
            )
    for key, ref in job_spec.inputs.items():
        upstream_id, _, _ = parse_input_ref(ref)
        if upstream_id is not None:
            try:
                readable_job(rt, p, upstream_id)
            except Forbidden:
                raise Forbidden(
                    f"inputs.{key}: job {upstream_id} belongs to another user; {p.name!r} may "
                    "not read its models"
                ) from None


def check_priority(p: Principal, priority: str) -> None:
    """Only admins raise a job above ``normal`` (with auth off, everyone is an admin)."""
    if not p.is_admin and PRIORITY_TIERS.index(priority) > PRIORITY_TIERS.index("normal"):
        raise Forbidden(
            f"priority {priority!r} is above 'normal': only admins may set it "
            f"(user {p.name!r} is a {p.role})"
        )


def check_entrypoint(job_spec: JobSpec, archive: Path) -> None:
    """Refuse a workdir archive that lacks the spec's entrypoint script."""
    names = list_members(archive)
    script = job_spec.script_path()
    if script is not None:
        wanted = script.removeprefix("./")
        if wanted not in names:
            shown = ", ".join(sorted(names)[:10]) or "no files"
            raise ArchiveError(
                f"entrypoint file {wanted!r} is not in the uploaded workdir "
                f"(it holds {len(names)} files: {shown})"
            )


def store_workdir(rt: Runtime, workdir: BinaryIO, job_spec: JobSpec) -> str:
    """Keep the uploaded workdir archive (bounded, checked to hold the entrypoint's file);
    its digest."""

    def validate(archive: Path) -> None:
        check_entrypoint(job_spec, archive)

    try:
        digest, _size = rt.blobs.put(workdir, rt.settings.max_upload_bytes, validate)
    except ValueError:
        raise UploadTooLarge(
            f"workdir archive is larger than {human_size(rt.settings.max_upload_bytes)}"
        ) from None
    return digest


def owner_of(p: Principal, claimed: str) -> str:
    """Who owns what ``p`` submits: the token's user; with auth off, the name sent."""
    return p.name if p.authenticated else (claimed or "anonymous")
