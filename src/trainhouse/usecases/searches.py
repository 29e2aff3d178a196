"""Hyperparameter searches: submit, list, show, best, cancel, and the dashboard's curves and
importances. The work is :mod:`trainhouse.tune`'s; each trial is an ordinary job. A search is
read by those who may read its trials' jobs, and changed by its owner or an admin; a submit
and a cancel are each one transaction with their audit entry."""

from __future__ import annotations

from typing import Any, BinaryIO

from trainhouse.core.errors import Forbidden, NotFound, SpecError, StoreError
from trainhouse.core.records import Search
from trainhouse.core.spec import JobSpec
from trainhouse.scheduler.resources import most_at_once
from trainhouse.store.searches import TRIAL_ACTIVE
from trainhouse.tune import study as studies
from trainhouse.tune import views
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.submission import (
    check_priority,
    owner_of,
    schedulable_spec,
    store_workdir,
)

__all__ = [
    "best",
    "cancel",
    "check_concurrency",
    "curves",
    "detail",
    "importances",
    "readable",
    "searches",
    "submit",
    "writable",
]


def readable(rt: Runtime, p: Principal, search_id: int) -> Search:
    """The search, if ``p`` may read it (as its trials' jobs): 403 if not, 404 if there is
    none."""
    search = rt.store.searches.get(search_id)
    if p.is_job:
        raise Forbidden(f"a job's credential reaches only its own job (job {p.job_id})")
    if not (p.is_admin or search.owner == p.name or rt.settings.job_visibility == "all"):
        raise Forbidden(f"search {search_id} belongs to another user; {p.name!r} may not read it")
    return search


def writable(rt: Runtime, p: Principal, search_id: int) -> Search:
    """The search, if ``p`` may change it (its owner or an admin)."""
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


def submit(rt: Runtime, p: Principal, spec: str, workdir: BinaryIO, owner: str) -> dict[str, Any]:
    """A new search from its spec (with a ``search:`` block) and uploaded workdir archive: its
    trials are jobs, started as ``max_concurrent`` allows. Its study exists before the answer
    (Optuna's own tables: made after the search's transaction commits). Returns the search as
    the API shows it (the fields of ``SearchOut``)."""
    job_spec = schedulable_spec(rt, spec)
    if job_spec.search is None:
        raise SpecError("the spec has no search: block; submit it as a job (POST /api/v1/jobs)")
    check_priority(p, job_spec.priority)
    studies.require()
    who = owner_of(p, owner)
    check_concurrency(rt, job_spec, who)
    digest = store_workdir(rt, workdir, job_spec)
    with rt.store.transaction():
        search = rt.store.searches.create(owner=who, spec=job_spec, archive_sha256=digest)
        audit.record(rt, p, "search.submit", f"search:{search.id}", name=search.name)
    rt.tune.opened(search)  # the study exists before the answer
    rt.tune.wake()
    return views.search_summary(search)


def searches(
    rt: Runtime, p: Principal, *, all: bool = False, limit: int = 200
) -> list[dict[str, Any]]:
    """Searches, newest first (by default the running ones), as the API shows them: the
    caller's own, or every one for those who see every job."""
    owner = None if p.sees_every_job(rt.settings.job_visibility) else p.name
    found = rt.store.searches.list(states=None if all else ["RUNNING"], owner=owner, limit=limit)
    counts = rt.store.searches.counts(s.id for s in found)
    return [views.search_summary(s, counts[s.id]) for s in found]


def detail(rt: Runtime, search: Search) -> dict[str, Any]:
    """The search, each trial (its job, state, hparams, latest and best objective) and the
    best trial (the fields of ``SearchDetailOut``). Reads Optuna's study: call it off the
    event loop."""
    return views.search_view(rt.store, rt.tune, search)


def best(rt: Runtime, search: Search) -> dict[str, Any]:
    """The best completed trial: its hparams and its best checkpoint (404 before one
    completed)."""
    found = views.best(rt.store, rt.tune, search)
    if found is None:
        raise NotFound(f"search {search.id} has no completed trial yet")
    return found


def curves(rt: Runtime, search: Search) -> list[dict[str, Any]]:
    """Each trial's objective by step: the values its pruner judged."""
    return views.curves(rt.store, rt.tune, search)


def importances(rt: Runtime, search: Search) -> dict[str, Any]:
    """Optuna's hparam importances, once enough trials completed."""
    return views.importances(rt.tune, search)


def cancel(rt: Runtime, p: Principal, search: Search) -> dict[str, Any]:
    """Cancel ``search`` (one the caller may change): no new trials, and every unfinished
    trial's job is canceled as a job is (:meth:`JobRepo.cancel`: a queued one ends now, a
    running one when the scheduler loop has stopped its processes); the search runner cancels
    any trial it added meanwhile. Returns the ended search as the API shows it."""
    with rt.store.transaction():
        if not rt.store.searches.end(search.id, "CANCELED", "canceled by request"):
            raise StoreError(
                f"search {search.id} has already ended ({search.state}); nothing to cancel"
            )
        active = [t for t in rt.store.searches.trials(search.id) if t.state == TRIAL_ACTIVE]
        jobs = rt.store.jobs.get_many(t.job_id for t in active)
        canceled = [j.id for j in jobs.values() if not j.state.terminal]
        for job_id in canceled:
            rt.store.jobs.cancel(job_id)
        audit.record(rt, p, "search.cancel", f"search:{search.id}", name=search.name)
    if canceled:
        rt.scheduler.wake()
    rt.tune.wake()
    ended = rt.store.searches.get(search.id)
    return views.search_summary(ended, rt.store.searches.counts([search.id])[search.id])
