"""The HTTP side of who is asking: the token of a request (a bearer header, or the dashboard's
cookie with the CSRF header on writes) turned into a principal, and the FastAPI dependencies
that need one (a person, a writer, an admin, a job the caller may read or act on, the job a
report comes from). Who a token names is :mod:`trainhouse.usecases.callers`; who may do what,
:mod:`trainhouse.usecases.access`."""

from __future__ import annotations

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainhouse.core.errors import Forbidden
from trainhouse.core.records import Job
from trainhouse.core.wire import CSRF_HEADER
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import RowId
from trainhouse.usecases import callers
from trainhouse.usecases.access import OPEN, WRITE_ROLES, Principal
from trainhouse.usecases.runtime import Runtime

COOKIE = "trainhouse_token"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


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
    """The principal of a request: OPEN with auth off, else whoever the token names; either
    calling from the request's address (what the audit log records)."""
    client = client_address(request)
    if not rt.auth.enabled:
        return OPEN.at(client)
    return callers.principal_of(rt, request_token(request, creds), client)


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
    return callers.readable_job(rt, p, job_id)


def writable_job(
    job_id: RowId, p: Principal = Depends(writer), rt: Runtime = Depends(runtime)
) -> Job:
    """The job, if the caller may act on it (its owner or an admin)."""
    return callers.writable_job(rt, p, job_id)


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
    checks out, with auth on or off (:func:`trainhouse.usecases.callers.reporting_job`)."""
    return callers.reporting_job(rt, job_id, bearer_token(authorization), client_address(request))
