"""MLflow's tracking routes (``/api/2.0/mlflow/...``) over trainhouse's jobs: each reads
MLflow's request fields (:mod:`.protocol`), calls its use case
(:mod:`trainhouse.usecases.tracking.runs`: a run is a job, metrics its series, params its
hparams, tags its tags) and answers in MLflow's shapes. Who may reach what:
:mod:`trainhouse.usecases.tracking.callers`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from trainhouse.core.records import Job
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
    run_id,
    run_info,
    run_json,
    text,
)
from trainhouse.usecases import media, tracking
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.tracking import runs

#: the tag MLflow's log_table sets to the tables a run logged
LOGGED_ARTIFACTS = "mlflow.loggedArtifacts"

router = APIRouter()


async def _request(request: Request) -> tuple[Runtime, tracking.Caller, dict[str, Any]]:
    """The services, the caller and the request's fields (JSON body, or the query of a GET)."""
    rt: Runtime = request.app.state.runtime
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
    exp = await run_in_threadpool(runs.experiment_named, rt, c, name)
    return _ok({"experiment": experiment_json(exp)})


@router.get("/api/2.0/mlflow/experiments/get")
async def get_experiment(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    number = experiment_id(data.get("experiment_id"))
    exp = await run_in_threadpool(runs.experiment, rt, c, number)
    return _ok({"experiment": experiment_json(exp)})


@router.post("/api/2.0/mlflow/experiments/create")
async def create_experiment(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    tracking.may_create(c)  # before the fields: a viewer is refused whatever it sends
    name = text(data, "name", limit=MAX_EXPERIMENT_NAME_LENGTH)
    assert name is not None
    exp = await run_in_threadpool(runs.create_experiment, rt, c, name)
    return _ok({"experiment_id": str(exp.id)})


# -- runs ------------------------------------------------------------------------------------
@router.post("/api/2.0/mlflow/runs/create")
async def create_run(request: Request) -> JSONResponse:
    """A new run: inside a job (its credential, or its scope's URI) the job itself, in the
    experiment asked for; outside one a tracked run, listed with the jobs."""
    rt, c, data = await _request(request)
    tracking.may_create(c)  # before the fields: a viewer is refused whatever it sends
    exp = experiment_id(data.get("experiment_id", "0"))
    run_name = text(data, "run_name", limit=MAX_RUN_NAME_LENGTH, required=False) or ""
    start = int64(data, "start_time", default=int(time.time() * 1000))
    tags = key_values(
        entries(data, "tags", MAX_PARAMS_TAGS_PER_BATCH), MAX_TAG_VAL_LENGTH, "Tag value"
    )
    user = None
    if c.job_id is None and not c.principal.authenticated:  # auth off: the name sent
        user = text(data, "user_id", limit=128, required=False)
    view = await run_in_threadpool(
        lambda: runs.create_run(
            rt, c, experiment_id=exp, run_name=run_name, start_time=start, tags=tags, user_id=user
        )
    )
    return _ok({"run": run_json(view)})


@router.get("/api/2.0/mlflow/runs/get")
async def get_run(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    number = run_id(data)
    return _ok({"run": run_json(await run_in_threadpool(runs.get_run, rt, c, number))})


@router.post("/api/2.0/mlflow/runs/update")
async def update_run(request: Request) -> JSONResponse:
    """A run's status, end time or name; a tracked run's job ends with it (FINISHED:
    COMPLETED, FAILED: FAILED, KILLED: CANCELED). A launched job's state stays the
    scheduler's."""
    rt, c, data = await _request(request)
    number = run_id(data)
    status = text(data, "status", limit=16, required=False)
    if status is not None and status not in tracking.RUN_STATUSES:
        raise invalid(
            f"Invalid value {status!r} for parameter 'status': one of {tracking.RUN_STATUSES}"
        )
    end = int64(data, "end_time", default=-1) if data.get("end_time") is not None else None
    name = text(data, "run_name", limit=MAX_RUN_NAME_LENGTH, required=False)
    job, run = await run_in_threadpool(
        lambda: runs.update_run(rt, c, number, status=status, end_time=end, run_name=name)
    )
    return _ok({"run_info": run_info(job, run)})


# -- logging ---------------------------------------------------------------------------------
def _points(metrics: list[dict[str, Any]]) -> list[tracking.LoggedPoint]:
    """Metrics as the mlflow client sends them (a timestamp in ms; no step: step 0)."""
    return [
        (
            key_of(m),
            double(m, "value"),
            int64(m, "step", default=0),
            int64(m, "timestamp", default=0) / 1000.0,
        )
        for m in metrics
    ]


async def _job_for_write(rt: Runtime, c: tracking.Caller, data: dict[str, Any]) -> Job:
    number = run_id(data)
    return await run_in_threadpool(tracking.run_job, rt, c, number, write=True)


@router.post("/api/2.0/mlflow/runs/log-metric")
async def log_metric(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    job = await _job_for_write(rt, c, data)
    await runs.log_metrics(rt, c, job, _points([data]))
    return _ok()


@router.post("/api/2.0/mlflow/runs/log-parameter")
async def log_parameter(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    values = key_values([data], MAX_PARAM_VAL_LENGTH, "Param value")
    job = await _job_for_write(rt, c, data)
    await run_in_threadpool(runs.log_params, rt, c, job, values)
    return _ok()


@router.post("/api/2.0/mlflow/runs/set-tag")
async def set_tag(request: Request) -> JSONResponse:
    rt, c, data = await _request(request)
    values = key_values([data], MAX_TAG_VAL_LENGTH, "Tag value")
    job = await _job_for_write(rt, c, data)
    await run_in_threadpool(runs.set_tags, rt, c, job, values)
    if LOGGED_ARTIFACTS in values:  # log_table's: its tables become the job's media
        refused = await run_in_threadpool(media.mlflow_tables, rt, c, job, values[LOGGED_ARTIFACTS])
        if refused:
            raise invalid("not shown as media: " + "; ".join(refused))
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
    await runs.log_batch(rt, c, job, params=param_values, tags=tag_values, metrics=_points(metrics))
    return _ok()


@router.get("/api/2.0/mlflow/metrics/get-history")
async def get_metric_history(request: Request) -> JSONResponse:
    """Every point of one of the run's own series (one per step), in step order."""
    rt, c, data = await _request(request)
    number = run_id(data)
    key = key_of(data, "metric_key")
    wanted = data.get("max_results")
    limit = None if wanted in (None, "") else int64(data, "max_results", low=1)
    token = text(data, "page_token", limit=40, required=False) or None
    found = await run_in_threadpool(
        lambda: runs.metric_history(rt, c, number, key, max_results=limit, page_token=token)
    )
    body: dict[str, Any] = {"metrics": history_json(key, found.points)}
    if found.next_token is not None:
        body["next_page_token"] = found.next_token
    return _ok(body)


@router.post("/api/2.0/mlflow/logged-models/search")
async def search_logged_models(request: Request) -> JSONResponse:
    """No logged models: this server keeps none (``runs:/<id>/path`` URIs ask it for the
    run's models before they list the run's own artifacts)."""
    await _request(request)
    return _ok({"models": []})
