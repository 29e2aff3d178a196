"""Who calls the MLflow API, and which job a request may reach.

Two scopes: ``/mlflow/jobs/<id>/...`` (the ``MLFLOW_TRACKING_URI`` a job's processes get) is
that job's own API, where every run is the job; ``/mlflow/...`` is the server's, where a run is
any job and ``runs/create`` makes a tracked run (an MLflow run made outside a job).

* A job's credential (``MLFLOW_TRACKING_TOKEN`` inside a job) reaches its own job only, in
  either scope, with auth on or off (as the report routes check it): it logs metrics, params,
  tags and artifacts to the job. A wrong one is refused as any token is (401, counted, 429
  past the limit).
* Anyone else follows the roles (:mod:`trainhouse.usecases.access`; with auth off everyone may
  do everything): reading a run needs the right to read its job; ``runs/create`` and
  ``experiments/create`` need a member or an admin; writing to a tracked run needs its owner or
  an admin. A launched job is written by its own script only (its credential): no person logs
  metrics into a job the server ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhouse.core.errors import Forbidden, NotFound, TrainhouseError, Unauthorized
from trainhouse.core.records import Job
from trainhouse.core.tokens import hash_token, job_of_token
from trainhouse.usecases.access import OPEN, WRITE_ROLES, Principal, job_credential
from trainhouse.usecases.callers import principal_of
from trainhouse.usecases.runtime import Runtime

__all__ = ["Caller", "caller", "credential_hash", "may_create", "run_job"]


@dataclass(frozen=True)
class Caller:
    """The caller of an MLflow request: its principal (calling from the request's address),
    the scope it called (the job whose own API this is, ``/mlflow/jobs/<id>``; None: the
    server's) and the token it presented."""

    principal: Principal
    scope: int | None
    token: str | None

    @property
    def job_id(self) -> int | None:
        """The only job this caller reaches: its scope's, or its credential's."""
        if self.scope is not None:
            return self.scope
        return self.principal.job_id if self.principal.is_job else None


def caller(
    rt: Runtime, token: str | None, client: str, *, scope: int | None, write: bool
) -> Caller:
    """Who presents ``token`` from ``client`` to ``scope``'s API (``write``: a request that is
    not a read). A job's credential is checked with auth on or off and reaches its own job
    only; in a job's scope anyone else may only read, and only a job they may read."""
    job_id = job_of_token(token) if token else None
    if token and job_id is not None:  # a job's credential: checked with auth on or off
        try:
            job: Job | None = rt.store.jobs.get(job_id)
        except TrainhouseError:
            job = None
        if job is None or not job_credential(job, token):
            raise rt.auth.refuse(client, "not the credential of a running attempt", token)
        if scope is not None and scope != job_id:
            raise Forbidden(f"a job's credential reaches only its own job (job {job_id})")
        return Caller(Principal(f"job:{job_id}", "job", job_id=job_id, client=client), scope, token)
    principal = principal_of(rt, token, client) if rt.auth.enabled else OPEN.at(client)
    if scope is not None:
        if write:
            raise Unauthorized(
                f"job {scope}'s MLflow API takes writes with the job's credential only "
                "(MLFLOW_TRACKING_TOKEN, which trainhouse sets in the job's environment)"
            )
        scoped = rt.store.jobs.get(scope)
        if not principal.may_read(scoped, rt.settings.job_visibility):
            raise Forbidden(
                f"job {scope} belongs to another user; {principal.name!r} may not read it"
            )
    return Caller(principal, scope, token)


def may_create(c: Caller) -> None:
    """Making an experiment or a tracked run: a member or an admin (or a job's credential)."""
    p = c.principal
    if p.is_job or p.is_admin or p.role in WRITE_ROLES:
        return
    raise Forbidden(f"user {p.name!r} is a {p.role}: viewers can read, not change anything")


def run_job(rt: Runtime, c: Caller, run: int, *, write: bool) -> Job:
    """The job run ``run`` names, if ``c`` may read it (``write``: change it)."""
    if c.job_id is not None and run != c.job_id:
        raise NotFound(f"Run with id={run} not found (this API is job {c.job_id}'s)")
    job = rt.store.jobs.get(run)
    p = c.principal
    if p.is_job:
        return job  # its own job: checked above
    if write:
        if not job.tracked:
            raise Forbidden(
                f"job {run} was launched by the server: only its own processes log to it (with "
                "the job's credential, MLFLOW_TRACKING_TOKEN in its environment)"
            )
        may_create(c)
        if not p.may_write(job):
            raise Forbidden(f"run {run} belongs to another user; {p.name!r} may not change it")
    elif not p.may_read(job, rt.settings.job_visibility):
        raise Forbidden(f"run {run} belongs to another user; {p.name!r} may not read it")
    return job


def credential_hash(c: Caller, job: Job) -> str:
    """What a metric report for ``job`` is checked against (:mod:`trainhouse.ingest.groupcommit`):
    the job's credential as presented, or (a tracked run, its writer checked) its own hash."""
    if c.principal.is_job and c.token:
        return hash_token(c.token)
    return job.token_hash or ""
