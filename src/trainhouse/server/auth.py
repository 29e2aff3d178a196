"""The HTTP side of who is asking: the token of a request (a bearer header, or the dashboard's
cookie with the CSRF header on writes) turned into a principal, and the FastAPI dependencies
that need one (a person, a writer, an admin, a job the caller may read or act on, the job a
report comes from). Who may do what is :mod:`trainhouse.usecases.access`."""

from __future__ import annotations

import logging

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainhouse.core.errors import Forbidden, TrainhouseError, Unauthorized
from trainhouse.core.tokens import job_of_token
from trainhouse.core.wire import CSRF_HEADER
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import RowId
from trainhouse.store import Job
from trainhouse.usecases.access import OPEN, Principal, job_credential
from trainhouse.usecases.runtime import Runtime

log = logging.getLogger(__name__)

COOKIE = "trainhouse_token"
CACHE_SECONDS = 5.0  # a verified user token is trusted this long without a query
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
WRITE_ROLES = ("admin", "member")


bearer = HTTPBearer(
    auto_error=False,
    description="An API token (`trainhouse login`, TRAINHOUSE_TOKEN) or a job's credential",
)


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def request_token(request: Request, creds: HTTPAuthorizationCredentials | None) -> str | None:
    if creds is not None and creds.credentials:
        return creds.credentials.strip()
    cookie = request.cookies.get(COOKIE)
    if cookie:
        if request.method not in SAFE_METHODS and request.headers.get(CSRF_HEADER) != "1":
            raise Forbidden(f"a write signed in by cookie must carry the {CSRF_HEADER}: 1 header")
        return cookie
    return None


def caller(
    request: Request,
    creds: HTTPAuthorizationCredentials | None = Depends(bearer),
    rt: Runtime = Depends(runtime),
) -> Principal:
    """The principal of a request: OPEN with auth off, else whoever the token names."""
    if not rt.auth.enabled:
        return OPEN
    return principal_of(rt, request_token(request, creds), client_address(request))


def principal_of(rt: Runtime, token: str | None, client: str) -> Principal:
    """Whoever ``token`` names now (auth on), as :func:`caller` finds it; also what an open
    log stream re-checks. Raises 401 (429 past the failure limit) for a token refused."""
    if not token:
        raise Unauthorized(
            "this server needs a token: `trainhouse login`, TRAINHOUSE_TOKEN, or the header "
            "Authorization: Bearer <token>"
        )
    job_id = job_of_token(token)
    if job_id is not None:
        try:
            job = rt.store.jobs.get(job_id)
        except TrainhouseError:
            job = None
        if job is None or not job_credential(job, token):
            raise rt.auth.refuse(client, "not the credential of a running attempt", token)
        return Principal(f"job:{job_id}", "job", job_id=job_id)
    return rt.auth.user(token, client)


def signed_in(p: Principal = Depends(caller)) -> Principal:
    """A person (not a job's credential)."""
    if p.is_job:
        raise Forbidden(f"a job's credential reaches only its own job (job {p.job_id})")
    return p


def writer(p: Principal = Depends(signed_in)) -> Principal:
    if not p.is_admin and p.role not in WRITE_ROLES:
        raise Forbidden(f"user {p.name!r} is a {p.role}: viewers can read, not change anything")
    return p


def admin(p: Principal = Depends(signed_in)) -> Principal:
    if not p.is_admin:
        raise Forbidden(f"only admins may do this; user {p.name!r} is a {p.role}")
    return p


def readable_job(
    job_id: RowId, p: Principal = Depends(caller), rt: Runtime = Depends(runtime)
) -> Job:
    """The job, if the caller may read it."""
    job = rt.store.jobs.get(job_id)
    if not p.may_read(job, rt.settings.job_visibility):
        if p.is_job:
            raise Forbidden(f"a job's credential reaches only its own job (job {p.job_id})")
        raise Forbidden(f"job {job_id} belongs to another user; {p.name!r} may not read it")
    return job


AuthHeader = Header(None, alias="Authorization", include_in_schema=False)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None: no such header)."""
    if not authorization or not authorization.startswith("Bearer "):
        return None
    return authorization.removeprefix("Bearer ").strip()


def reporting_job(
    job_id: RowId,
    request: Request,
    authorization: str | None = AuthHeader,
    rt: Runtime = Depends(runtime),
) -> Job:
    """The job a request reports for (metrics, checkpoints), once its per-attempt credential
    checks out, with auth on or off. A wrong one is refused as any token is: counted against
    the client's address (429 past the limit) and audited."""
    job = rt.store.jobs.get(job_id)
    token = bearer_token(authorization)
    if token is None:
        raise Unauthorized("this endpoint needs the job's credential (Authorization: Bearer ...)")
    if not job_credential(job, token):
        why = f"the credential is not valid for job {job.id}'s current attempt"
        raise rt.auth.refuse(client_address(request), why, token)
    return job


def writable_job(
    job_id: RowId, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> Job:
    """The job, if the caller may act on it (its owner or an admin)."""
    job = rt.store.jobs.get(job_id)
    if not p.may_write(job):
        raise Forbidden(f"job {job_id} belongs to another user; {p.name!r} may not change it")
    return job


def audit(
    rt: Runtime,
    request: Request,
    p: Principal,
    action: str,
    target: str | None = None,
    **detail: object,
) -> None:
    """Record an action in the audit log (a failure to write it is logged, not raised)."""
    try:
        rt.store.accounts.audit(
            p.name, action, target, detail=dict(detail) or None, client=client_address(request)
        )
    except Exception:
        log.exception("could not write the audit log (%s %s)", action, target)
