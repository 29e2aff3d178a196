"""Who a request's token names, and the jobs a caller reaches through it.

The HTTP side (:mod:`trainhouse.server.auth`) reads the token of a request (a bearer header, the
dashboard's cookie) and hands it here; what a principal may do is :mod:`.access`.
"""

from __future__ import annotations

from trainhouse.core.errors import Forbidden, TrainhouseError, Unauthorized
from trainhouse.core.records import Job
from trainhouse.core.tokens import job_of_token
from trainhouse.usecases.access import Principal, job_credential
from trainhouse.usecases.runtime import Runtime


def principal_of(rt: Runtime, token: str | None, client: str) -> Principal:
    """Whoever ``token`` names now (auth on), calling from ``client``; also what an open log
    stream re-checks. Raises 401 (429 past the failure limit) for a token refused."""
    if not token:
        raise Unauthorized(
            "this server needs a token: `trainhouse login`, TRAINHOUSE_TOKEN, or the header "
            "Authorization: Bearer <token>"
        )
    job_id = job_of_token(token)
    if job_id is not None:
        try:
            job: Job | None = rt.store.jobs.get(job_id)
        except TrainhouseError:
            job = None
        if job is None or not job_credential(job, token):
            raise rt.auth.refuse(client, "not the credential of a running attempt", token)
        return Principal(f"job:{job_id}", "job", job_id=job_id, client=client)
    return rt.auth.user(token, client).at(client)


def known_principal(rt: Runtime, token: str | None, client: str) -> Principal | None:
    """What :func:`principal_of` answers for ``token`` when it needs no query (a user's token
    verified in the last seconds), calling from ``client``; None when it does (a job's
    credential, a token not seen lately, no token: :func:`principal_of` decides)."""
    if not token or job_of_token(token) is not None:
        return None
    found = rt.auth.cached(token)
    return None if found is None else found.at(client)


def readable_job(rt: Runtime, p: Principal, job_id: int) -> Job:
    """The job, if ``p`` may read it (403 if not, 404 if there is none)."""
    job = rt.store.jobs.get(job_id)
    if not p.may_read(job, rt.settings.job_visibility):
        if p.is_job:
            raise Forbidden(f"a job's credential reaches only its own job (job {p.job_id})")
        raise Forbidden(f"job {job_id} belongs to another user; {p.name!r} may not read it")
    return job


def writable_job(rt: Runtime, p: Principal, job_id: int) -> Job:
    """The job, if ``p`` may act on it (its owner or an admin)."""
    job = rt.store.jobs.get(job_id)
    if not p.may_write(job):
        raise Forbidden(f"job {job_id} belongs to another user; {p.name!r} may not change it")
    return job


def reporting_job(rt: Runtime, job_id: int, token: str | None, client: str) -> Job:
    """The job a request reports for (metrics, checkpoints), once its per-attempt credential
    ``token`` checks out, with auth on or off. A wrong one is refused as any token is: counted
    against ``client`` (429 past the limit) and audited."""
    job = rt.store.jobs.get(job_id)
    if token is None:
        raise Unauthorized("this endpoint needs the job's credential (Authorization: Bearer ...)")
    if not job_credential(job, token):
        why = f"the credential is not valid for job {job.id}'s current attempt"
        raise rt.auth.refuse(client, why, token)
    return job
