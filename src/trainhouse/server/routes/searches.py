"""Hyperparameter searches: submit, list, show, best, cancel, and the dashboard's curves and
importances. The work is :mod:`trainhouse.usecases.searches`'s; these routes parse, call and
render."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from starlette.concurrency import run_in_threadpool

from trainhouse.core.records import Search
from trainhouse.server.auth import caller, signed_in, writer
from trainhouse.server.deps import runtime
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
from trainhouse.usecases import searches
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["searches"])


def readable_search(
    search_id: RowId, p: Principal = Depends(caller), rt: Runtime = Depends(runtime)
) -> Search:
    """The search, if the caller may read it (as its trials' jobs)."""
    return searches.readable(rt, p, search_id)


def writable_search(
    search_id: RowId, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> Search:
    """The search, if the caller may change it (its owner or an admin)."""
    return searches.writable(rt, p, search_id)


@router.post("/searches", response_model=SearchOut, status_code=201)
def submit(
    spec: Annotated[str, Form(description="The spec (with a search: block) as YAML or JSON")],
    workdir: Annotated[UploadFile, File(description="The workdir as a .tar.gz archive")],
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
    return SearchOut(**searches.submit(rt, p, spec, workdir.file, owner))


@router.get("/searches", response_model=SearchListOut)
def list_searches(
    all: bool = Query(False, description="Include ended searches"),
    limit: int = Query(200, ge=1, le=10000),
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> SearchListOut:
    """Searches, newest first (by default the running ones): the caller's own, or every one
    for those who see every job."""
    found = searches.searches(rt, p, all=all, limit=limit)
    return SearchListOut(searches=[SearchOut(**s) for s in found])


@router.get("/searches/{search_id}", response_model=SearchDetailOut)
async def show(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchDetailOut:
    """The search, each trial (its job, state, hparams, latest and best objective) and the
    best trial."""
    return SearchDetailOut(**await run_in_threadpool(searches.detail, rt, search))


@router.get("/searches/{search_id}/best", response_model=SearchBestOut)
async def best(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchBestOut:
    """The best completed trial: its hparams and its best checkpoint."""
    return SearchBestOut(**await run_in_threadpool(searches.best, rt, search))


@router.get("/searches/{search_id}/curves", response_model=SearchCurvesOut)
async def curves(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> SearchCurvesOut:
    """Each trial's objective by step: the values its pruner judged."""
    found = await run_in_threadpool(searches.curves, rt, search)
    return SearchCurvesOut(trials=found)


@router.get("/searches/{search_id}/importances", response_model=ImportancesOut)
async def importances(
    search: Search = Depends(readable_search), rt: Runtime = Depends(runtime)
) -> ImportancesOut:
    """Optuna's hparam importances, once enough trials completed."""
    return ImportancesOut(**await run_in_threadpool(searches.importances, rt, search))


@router.post("/searches/{search_id}/cancel", response_model=SearchOut)
def cancel(
    search: Search = Depends(writable_search),
    p: Principal = Depends(writer),
    rt: Runtime = Depends(runtime),
) -> SearchOut:
    """No new trials; every unfinished trial's job is canceled."""
    return SearchOut(**searches.cancel(rt, p, search))
