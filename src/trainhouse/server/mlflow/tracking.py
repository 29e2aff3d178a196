"""MLflow's tracking routes (``/api/2.0/mlflow/...``) over trainhouse's jobs.

A run is a job (its run id is the job's id): metrics are the job's series, stored through the
same group commit as the SDK's reports (:mod:`trainhouse.ingest.groupcommit`, one point per
(name, step): a step logged again replaces the value, as ``run.log`` does), params are its
reported hparams and tags its tags (:mod:`trainhouse.store.tracking`). Who may reach what:
:mod:`.access`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from trainhouse.core.errors import InvalidMetrics
from trainhouse.core.reports import Columns, Report, check_columns
from trainhouse.core.tokens import hash_token
from trainhouse.ingest.groupcommit import Refused
from trainhouse.server.auth import client_address
from trainhouse.server.mlflow import access
from trainhouse.server.mlflow.protocol import (
    MAX_ENTITIES_PER_BATCH,
    MAX_EXPERIMENT_NAME_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_RUN_NAME_LENGTH,
    MAX_TAG_VAL_LENGTH,
    body_of,
    double,
    entries,
    experiment_id,
    experiment_json,
    history_json,
    int64,
    invalid,
    key_of,
    key_values,
    pairs,
    run_id,
    run_info,
    text,
    value_out,
)
from trainhouse.store import Job
from trainhouse.store.tracking import RUN_STATUSES
from trainhouse.usecases.runtime import Runtime

router = APIRouter()

#: points of one series answered by metrics/get-history (all of a longer one, downsampled
#: keeping each step bucket's extremes)
MAX_HISTORY = 100_000


async def _svc(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def _request(request: Request) -> tuple[Runtime, access.Caller, dict[str, Any]]:
    """The services, the caller and the request's fields (JSON body, or the query of a GET)."""
    rt = await _svc(request)
    if request.method == "GET":
        data: dict[str, Any] = dict(request.query_params)
    else:
        data = body_of(await request.body())
    c = await run_in_threadpool(access.caller, request, rt)
    return rt, c, data


def _ok(body: dict[str, Any] | None = None) -> JSONResponse:
    return JSONResponse(body or {})


# -- experiments -----------------------------------------------------------------------------
@router.get("/api/2.0/mlflow/experiments/get-by-name")
async def get_experiment_by_name(request: Request) -> JSONResponse:
    """The experiment of that name; 404 RESOURCE_DOES_NOT_EXIST (the client then makes it).
    Inside a job's scope the job's run moves to it (``mlflow.set_experiment`` before
    ``start_run``: MLflow refuses a run id whose experiment is not the active one)."""
    rt, c, data = await _request(request)
    name = text(data, "experiment_name", limit=MAX_EXPERIMENT_NAME_LENGTH)
    assert name is not None
    exp = await run_in_threadpool(rt.store.tracking.experiment_named, name)
    if c.principal.is_job and c.job_id is not None:
        await run_in_threadpool(_move, rt, c.job_id, exp.id)
    return _ok({"experiment": experiment_json(exp)})


@router.get("/api/2.0/mlflow/experiments/get")
async def get_experiment(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    number = experiment_id(data.get("experiment_id"))
    exp = await run_in_threadpool(rt.store.tracking.experiment, number)
    if c.principal.is_job and c.job_id is not None:
        await run_in_threadpool(_move, rt, c.job_id, exp.id)
    return _ok({"experiment": experiment_json(exp)})


@router.post("/api/2.0/mlflow/experiments/create")
async def create_experiment(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    access.may_create(c)
    name = text(data, "name", limit=MAX_EXPERIMENT_NAME_LENGTH)
    assert name is not None
    exp = await run_in_threadpool(rt.store.tracking.create_experiment, name)
    if c.principal.is_job and c.job_id is not None:
        await run_in_threadpool(_move, rt, c.job_id, exp.id)
    return _ok({"experiment_id": str(exp.id)})


def _move(rt: Runtime, job_id: int, experiment: int) -> None:
    job = rt.store.jobs.get(job_id)
    rt.store.tracking.update_run(job, experiment_id=experiment)


# -- runs ------------------------------------------------------------------------------------
def _run_json(rt: Runtime, job: Job) -> dict[str, Any]:
    run = rt.store.tracking.run(job)
    fresh = rt.store.jobs.get(job.id)
    metrics = [
        {
            "key": name,
            "value": value_out(value),
            "timestamp": int(fresh.updated_at * 1000),
            "step": fresh.last_step or 0,
        }
        for name, value in sorted(fresh.latest_metrics.items())
    ]
    return {
        "info": run_info(fresh, run),
        "data": {
            "metrics": metrics,
            "params": pairs(rt.store.tracking.values(job.id, "param")),
            "tags": pairs(rt.store.tracking.values(job.id, "tag")),
        },
        "inputs": {},
    }


@router.post("/api/2.0/mlflow/runs/create")
async def create_run(request: Request) -> JSONResponse:
    """A new run: inside a job (its credential, or its scope's URI) the job itself, in the
    experiment asked for; outside one a tracked run, listed with the jobs."""
    rt, c, data = await _request(request)
    access.may_create(c)
    exp = experiment_id(data.get("experiment_id", "0"))
    run_name = text(data, "run_name", limit=MAX_RUN_NAME_LENGTH, required=False) or ""
    start = int64(data, "start_time", default=int(time.time() * 1000))
    tags = key_values(
        entries(data, "tags", MAX_PARAMS_TAGS_PER_BATCH), MAX_TAG_VAL_LENGTH, "Tag value"
    )
    run_name = run_name or tags.get("mlflow.runName", "")
    if c.job_id is not None:
        job = await run_in_threadpool(rt.store.jobs.get, c.job_id)

        def attach() -> dict[str, Any]:
            rt.store.tracking.experiment(exp)
            rt.store.tracking.update_run(
                job, status="RUNNING", run_name=run_name or None, experiment_id=exp
            )
            rt.store.tracking.put(job.id, "tag", tags)
            return _run_json(rt, job)

        return _ok({"run": await run_in_threadpool(attach)})
    user = c.principal.name
    if not c.principal.authenticated:  # auth off: the owner is the name the client sends
        sent = text(data, "user_id", limit=128, required=False)
        user = sent or user
    run_name = run_name or f"run-{secrets.token_hex(3)}"
    tags.setdefault("mlflow.runName", run_name)

    def create() -> dict[str, Any]:
        job = rt.store.tracking.create_tracked(
            owner=user,
            run_name=run_name,
            experiment_id=exp,
            start_time=start,
            token_hash=hash_token(secrets.token_urlsafe(32)),  # a token nobody holds
            tags=tags,
        )
        rt.store.accounts.audit(
            c.principal.name,
            "mlflow.run.create",
            f"job:{job.id}",
            detail={"name": job.name},
            client=client_address(request),
        )
        return _run_json(rt, job)

    return _ok({"run": await run_in_threadpool(create)})


@router.get("/api/2.0/mlflow/runs/get")
async def get_run(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    number = run_id(data)

    def read() -> dict[str, Any]:
        return _run_json(rt, access.run_job(rt, c, number, write=False))

    return _ok({"run": await run_in_threadpool(read)})


@router.post("/api/2.0/mlflow/runs/update")
async def update_run(request: Request) -> JSONResponse:
    """A run's status, end time or name; a tracked run's job ends with it (FINISHED:
    COMPLETED, FAILED: FAILED, KILLED: CANCELED). A launched job's state stays the
    scheduler's."""
    rt, c, data = await _request(request)
    number = run_id(data)
    status = text(data, "status", limit=16, required=False)
    if status is not None and status not in RUN_STATUSES:
        raise invalid(f"Invalid value {status!r} for parameter 'status': one of {RUN_STATUSES}")
    end = int64(data, "end_time", default=-1) if data.get("end_time") is not None else None
    name = text(data, "run_name", limit=MAX_RUN_NAME_LENGTH, required=False)

    def change() -> dict[str, Any]:
        job = access.run_job(rt, c, number, write=True)
        run = rt.store.tracking.update_run(job, status=status, end_time=end, run_name=name)
        return run_info(rt.store.jobs.get(job.id), run)

    return _ok({"run_info": await run_in_threadpool(change)})


# -- logging ---------------------------------------------------------------------------------
async def _store_metrics(
    rt: Runtime, c: access.Caller, job: Job, metrics: list[dict[str, Any]], client: str
) -> None:
    """Metrics through the report path: checked, then one group commit."""
    if not metrics:
        return
    names, values, steps, walls = [], [], [], []
    for m in metrics:
        names.append(key_of(m))
        values.append(double(m, "value"))
        steps.append(int64(m, "step", default=0))
        walls.append(int64(m, "timestamp", default=0) / 1000.0)
    attempt = max(1, job.attempts)
    try:
        columns = check_columns(
            Columns(steps, names, values, [None] * len(names), walls, attempt), "metrics"
        )
    except InvalidMetrics as exc:
        raise invalid(str(exc)) from None
    report = Report(uuid.uuid4().hex, attempt, columns)
    try:
        stored = await asyncio.wrap_future(
            rt.reports.submit(job.id, report, access.credential_hash(c, job))
        )
    except Refused:
        why = f"the credential is not valid for job {job.id}'s current attempt"
        raise await run_in_threadpool(rt.auth.refuse, client, why, c.token or "") from None
    rt.telemetry.points.inc(stored.accepted)


async def _job_for_write(rt: Runtime, c: access.Caller, data: dict[str, Any]) -> Job:
    number = run_id(data)
    return await run_in_threadpool(access.run_job, rt, c, number, write=True)


@router.post("/api/2.0/mlflow/runs/log-metric")
async def log_metric(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    job = await _job_for_write(rt, c, data)
    await _store_metrics(rt, c, job, [data], client_address(request))
    return _ok()


@router.post("/api/2.0/mlflow/runs/log-parameter")
async def log_parameter(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    values = key_values([data], MAX_PARAM_VAL_LENGTH, "Param value")
    job = await _job_for_write(rt, c, data)
    await run_in_threadpool(rt.store.tracking.put, job.id, "param", values)
    return _ok()


@router.post("/api/2.0/mlflow/runs/set-tag")
async def set_tag(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    values = key_values([data], MAX_TAG_VAL_LENGTH, "Tag value")
    job = await _job_for_write(rt, c, data)
    await run_in_threadpool(rt.store.tracking.put, job.id, "tag", values)
    return _ok()


@router.post("/api/2.0/mlflow/runs/log-batch")
async def log_batch(request: Request) -> JSONResponse:
    """Up to 1000 metrics, 100 params and 100 tags, 1000 in all (MLflow's limits); params
    and tags first, then the metrics in one report."""
    rt, c, data = await _request(request)
    metrics = entries(data, "metrics", MAX_METRICS_PER_BATCH)
    params = entries(data, "params", MAX_PARAMS_TAGS_PER_BATCH)
    tags = entries(data, "tags", MAX_PARAMS_TAGS_PER_BATCH)
    total = len(metrics) + len(params) + len(tags)
    if total > MAX_ENTITIES_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {MAX_ENTITIES_PER_BATCH} metrics, "
            f"params, and tags in total. Got {total}."
        )
    param_values = key_values(params, MAX_PARAM_VAL_LENGTH, "Param value")
    tag_values = key_values(tags, MAX_TAG_VAL_LENGTH, "Tag value")
    job = await _job_for_write(rt, c, data)

    def put() -> None:
        rt.store.tracking.put(job.id, "param", param_values)
        rt.store.tracking.put(job.id, "tag", tag_values)

    if param_values or tag_values:
        await run_in_threadpool(put)
    await _store_metrics(rt, c, job, metrics, client_address(request))
    return _ok()


@router.get("/api/2.0/mlflow/metrics/get-history")
async def get_metric_history(request: Request) -> JSONResponse:
    """Every point of one of the run's own series (one per step), in step order."""
    rt, c, data = await _request(request)
    number = run_id(data)
    key = key_of(data, "metric_key")

    def read() -> list[dict[str, Any]]:
        job = access.run_job(rt, c, number, write=False)
        found = rt.store.metrics.series(job.id, name=key)
        if not found:
            return []
        points = rt.store.metrics.series_points(job.id, found[0], max_points=MAX_HISTORY)
        return history_json(key, points)

    return _ok({"metrics": await run_in_threadpool(read)})


@router.post("/api/2.0/mlflow/logged-models/search")
async def search_logged_models(request: Request) -> JSONResponse:
    """No logged models: this server keeps none (``runs:/<id>/path`` URIs ask it for the
    run's models before they list the run's own artifacts)."""
    await _request(request)
    return _ok({"models": []})
