"""Hyperparameter searches: submit, list, show, best, cancel, and the dashboard's curves and
importances. The work is :mod:`trainhouse.tune`'s; each trial is an ordinary job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from trainhouse.core.errors import Forbidden, NotFound, SpecError, StoreError
from trainhouse.core.spec import JobSpec
from trainhouse.scheduler.resources import most_at_once
from trainhouse.server.auth import audit, caller, signed_in, writer
from trainhouse.server.deps import runtime
from trainhouse.server.routes.jobs import (
    check_priority,
    owner_of,
    schedulable_spec,
    store_workdir,
)
from trainhouse.server.schemas import (
    NO_NUL,
    ImportancesOut,
    RowId,
    SearchBestOut,
    SearchCurvesOut,
    SearchDetailOut,
    SearchListOut,
    SearchOut,
)
from trainhouse.store import Search
from trainhouse.tune import study as studies
from trainhouse.tune import views
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["searches"])


def readable_search(
    search_id: RowId, p: Principal = Depends(caller), rt: Runtime = Depends(runtime)
) -> Search:
    """The search, if the caller may read it (as its trials' jobs)."""
    search = rt.store.searches.get(search_id)
    if p.is_job:
        raise Forbidden(f"a job's credential reaches only its own job (job {p.job_id})")
    if not (p.is_admin or search.owner == p.name or rt.settings.job_visibility == "all"):
        raise Forbidden(f"search {search_id} belongs to another user; {p.name!r} may not read it")
    return search


def writable_search(
    search_id: RowId, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> Search:
    search = rt.store.searches.get(search_id)
    if not (p.is_admin or search.owner == p.name):
        raise Forbidden(f"search {search_id} belongs to another user; {p.name!r} may not change it")
    return search


def check_concurrency(rt: Runtime, spec: JobSpec, owner: str) -> None:
    """Refuse a max_concurrent that could never run at once: the server's inventory and the
    owner's quota."""
    assert spec.search is not None
    limits = rt.store.quotas.limits().get(owner)
    quota = rt.scheduler.config.default_quota
    max_cpus = limits.max_cpus if limits and limits.max_cpus is not None else quota.cpus
    max_gpus = limits.max_gpus if limits and limits.max_gpus is not None else quota.gpus
    res = spec.resources
    fits = most_at_once(rt.scheduler.executor.capacity(), res, max_cpus=max_cpus, max_gpus=max_gpus)
    wanted = spec.search.max_concurrent
    if wanted > fits:
        each = f"{res.nodes} node(s) x {res.cpus_per_node} CPU cores" + (
            f" and {res.gpus_per_node} GPU(s)" if res.gpus_per_node else ""
        )
        capped = " within the owner's quota" if max_cpus is not None or max_gpus else ""
        raise SpecError(
            f"search.max_concurrent is {wanted}, but at most {fits} trial(s) (each {each}) "
            f"can ever run at once on this server{capped}; set search.max_concurrent: "
            f"{max(fits, 1)}"
        )


@router.post("/searches", response_model=SearchOut, status_code=201)
def submit(
    spec: Annotated[str, Form(description="The spec (with a search: block) as YAML or JSON")],
    workdir: Annotated[UploadFile, File(description="The workdir as a .tar.gz archive")],
    request: Request,
    owner: Annotated[
        str,
        Form(
            max_length=128,
            pattern=NO_NUL,
            description="Ignored when auth is on: the token's user owns it",
        ),
    ] = "anonymous",
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> SearchOut:
    """A new search: its trials are jobs, started as ``max_concurrent`` allows."""
    job_spec = schedulable_spec(spec, rt)
    if job_spec.search is None:
        raise SpecError("the spec has no search: block; submit it as a job (POST /api/v1/jobs)")
    check_priority(p, job_spec.priority)
    studies.require()
    who = owner_of(p, owner)
    check_concurrency(rt, job_spec, who)
    digest = store_workdir(rt, workdir, job_spec)
    search = rt.store.searches.create(owner=who, spec=job_spec, archive_sha256=digest)
    rt.tune.opened(search)  # the study exists before the answer
    audit(rt, request, p, "search.submit", f"search:{search.id}", name=search.name)
    rt.tune.wake()
    return SearchOut(**views.search_summary(search))


@router.get("/searches", response_model=SearchListOut)
def list_searches(
    all: bool = Query(False, description="Include ended searches"),
    limit: int = Query(200, ge=1, le=10000),
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> SearchListOut:
    """Searches, newest first (by default the running ones): the caller's own, or every one
    for those who see every job."""
    owner = None if p.sees_every_job(rt.settings.job_visibility) else p.name
    found = rt.store.searches.list(states=None if all else ["RUNNING"], owner=owner, limit=limit)
    counts = rt.store.searches.counts(s.id for s in found)
    return SearchListOut(
        searches=[SearchOut(**views.search_summary(s, counts[s.id])) for s in found]
    )


@router.get("/searches/{search_id}", response_model=SearchDetailOut)
async def show(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchDetailOut:
    """The search, each trial (its job, state, hparams, latest and best objective) and the
    best trial."""
    view = await run_in_threadpool(views.search_view, rt.store, rt.tune, search)
    return SearchDetailOut(**view)


@router.get("/searches/{search_id}/best", response_model=SearchBestOut)
async def best(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchBestOut:
    """The best completed trial: its hparams and its best checkpoint."""
    found = await run_in_threadpool(views.best, rt.store, rt.tune, search)
    if found is None:
        raise NotFound(f"search {search.id} has no completed trial yet")
    return SearchBestOut(**found)


@router.get("/searches/{search_id}/curves", response_model=SearchCurvesOut)
async def curves(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchCurvesOut:
    """Each trial's objective by step: the values its pruner judged."""
    found = await run_in_threadpool(views.curves, rt.store, rt.tune, search)
    return SearchCurvesOut(trials=found)


@router.get("/searches/{search_id}/importances", response_model=ImportancesOut)
async def importances(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> ImportancesOut:
    """Optuna's hparam importances, once enough trials completed."""
    return ImportancesOut(**await run_in_threadpool(views.importances, rt.tune, search))


@router.post("/searches/{search_id}/cancel", response_model=SearchOut)
def cancel(
    request: Request,
    search: Search = Depends(writable_search),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> SearchOut:
    """No new trials; every unfinished trial's job is canceled."""
    if not rt.store.searches.end(search.id, "CANCELED", "canceled by request"):
        raise StoreError(
            f"search {search.id} has already ended ({search.state}); nothing to cancel"
        )
    audit(rt, request, p, "search.cancel", f"search:{search.id}", name=search.name)
    rt.tune.wake()
    ended = rt.store.searches.get(search.id)
    return SearchOut(
        **views.search_summary(ended, rt.store.searches.counts([search.id])[search.id])
    )
