"""Who is asking, and what they may do.

A request names its caller with ``Authorization: Bearer <token>`` (or, from the dashboard, the
``trainhouse_token`` cookie that ``POST /api/v1/session`` sets). The caller is one of:

=========  ==================================================================================
admin      everything: every job, users, tokens, quotas, priorities above ``normal``, audit
member     submits jobs; reads and acts on their own jobs (others' per ``--job-visibility``)
viewer     reads, never writes: their own jobs (none) and others' per ``--job-visibility``
job        a job's per-attempt credential (``thj_<id>_...``): reports to and reads its own
           job only; it dies when the attempt ends
=========  ==================================================================================

``--job-visibility`` says what non-admins see of other users' jobs: ``own`` (the default)
nothing; ``list`` the job list and queue (names, owners, states; no text the job controls:
``routes.jobs.job_out``); ``all`` everything, read-only. A job someone may not read
answers 403, never its data.

With auth off (the embedded server on 127.0.0.1), every caller is :data:`OPEN`: allowed
everything, and a job's owner is the name the client sends. Job credentials are checked in
both modes.

Failed token uses are counted per client address: past ``auth_failures`` within
``auth_window`` seconds, further failures from that address get 429 instead of 401 until the
window has passed (a valid token still works: people behind one NAT share an address). Each
401 is in the audit log. That holds for every token: a person's, a job's credential on any
route, and the credential the report routes check (:func:`reporting_job`) with auth on or off.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trainhouse._http import CSRF_HEADER
from trainhouse.errors import Forbidden, RateLimited, TrainhouseError, Unauthorized
from trainhouse.server.deps import Services, services
from trainhouse.server.schemas import RowId
from trainhouse.store import Job
from trainhouse.store.accounts import Accounts
from trainhouse.tokens import JOB_TOKEN_PREFIX, USER_TOKEN_PREFIX, hash_token, job_of_token

log = logging.getLogger(__name__)

COOKIE = "trainhouse_token"
CACHE_SECONDS = 5.0  # a verified user token is trusted this long without a query
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
WRITE_ROLES = ("admin", "member")


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    name: str  # a user's name; job:<id> for a job's credential
    role: str  # admin | member | viewer | job | open (auth off)
    job_id: int | None = None
    token_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role in ("admin", "open")

    @property
    def is_job(self) -> bool:
        return self.role == "job"

    @property
    def authenticated(self) -> bool:
        return self.role != "open"

    def may_read(self, job: Job, visibility: str) -> bool:
        if self.is_job:
            return self.job_id == job.id
        return self.is_admin or job.owner == self.name or visibility == "all"

    def may_write(self, job: Job) -> bool:
        if self.is_job or self.role == "viewer":
            return False
        return self.is_admin or job.owner == self.name

    def sees_every_job(self, visibility: str) -> bool:
        return self.is_admin or visibility in ("list", "all")


OPEN = Principal("anonymous", "open")


class FailureLimiter:
    """Counts failed token uses per client address in a sliding window."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.setdefault(client, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.limit:
                return 0.0
            return max(0.0, times[-self.limit] + self.window - now)

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._recent(client, now).append(now)
            if len(self._failures) > 10_000:  # forget idle addresses
                for key in [k for k, v in self._failures.items() if not v]:
                    del self._failures[key]


class Authenticator:
    """Turns a token into a :class:`Principal` (user tokens cached briefly)."""

    def __init__(self, accounts: Accounts, *, enabled: bool, limit: int, window: float) -> None:
        self.accounts = accounts
        self.enabled = enabled
        self.limiter = FailureLimiter(limit, window)
        self._cache: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop cached tokens (after a revocation, a role change, a disabled user)."""
        with self._lock:
            self._cache.clear()

    def refuse(self, client: str, why: str, token: str) -> TrainhouseError:
        """The error for a failed token use: 401, audited; 429 once the client's address has
        failed too often (not audited one by one: a flood must not flood the log). A valid
        token is never refused for its address: people behind one NAT share it."""
        wait = self.limiter.retry_after(client)
        self.limiter.failed(client)
        if wait > 0:
            return RateLimited(
                f"too many failed token uses from {client}; try again in {wait:.0f} s"
            )
        shown = token[:10] if token.startswith((USER_TOKEN_PREFIX, JOB_TOKEN_PREFIX)) else None
        with contextlib.suppress(Exception):  # the audit must never turn a 401 into a 500
            self.accounts.audit(
                "-",
                "auth.failure",
                None,
                ok=False,
                detail={"reason": why, "token": shown},
                client=client,
            )
        return Unauthorized(f"the token was refused: {why}")

    def user(self, token: str, client: str) -> Principal:
        key = hash_token(token)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        found = self.accounts.authenticate(token)
        if isinstance(found, str):
            raise self.refuse(client, found, token)
        user, record = found
        principal = Principal(user.name, user.role, token_id=record.id)
        expires = now + CACHE_SECONDS
        if record.expires_at is not None:
            expires = min(expires, now + max(0.0, record.expires_at - time.time()))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (principal, expires)
        return principal


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


def job_credential(job: Job, token: str) -> bool:
    return job.token_hash is not None and hmac.compare_digest(hash_token(token), job.token_hash)


def caller(
    request: Request,
    creds: HTTPAuthorizationCredentials | None = Depends(bearer),
    svc: Services = Depends(services),
) -> Principal:
    """The principal of a request: OPEN with auth off, else whoever the token names."""
    if not svc.auth.enabled:
        return OPEN
    return principal_of(svc, request_token(request, creds), client_address(request))


def principal_of(svc: Services, token: str | None, client: str) -> Principal:
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
            job = svc.store.jobs.get(job_id)
        except TrainhouseError:
            job = None
        if job is None or not job_credential(job, token):
            raise svc.auth.refuse(client, "not the credential of a running attempt", token)
        return Principal(f"job:{job_id}", "job", job_id=job_id)
    return svc.auth.user(token, client)


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
    job_id: RowId, p: Principal = Depends(caller), svc: Services = Depends(services)
) -> Job:
    """The job, if the caller may read it."""
    job = svc.store.jobs.get(job_id)
    if not p.may_read(job, svc.settings.job_visibility):
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
    svc: Services = Depends(services),
) -> Job:
    """The job a request reports for (metrics, checkpoints), once its per-attempt credential
    checks out, with auth on or off. A wrong one is refused as any token is: counted against
    the client's address (429 past the limit) and audited."""
    job = svc.store.jobs.get(job_id)
    token = bearer_token(authorization)
    if token is None:
        raise Unauthorized("this endpoint needs the job's credential (Authorization: Bearer ...)")
    if not job_credential(job, token):
        why = f"the credential is not valid for job {job.id}'s current attempt"
        raise svc.auth.refuse(client_address(request), why, token)
    return job


def writable_job(
    job_id: RowId, p: Principal = Depends(writer), svc: Services = Depends(services)
) -> Job:
    """The job, if the caller may act on it (its owner or an admin)."""
    job = svc.store.jobs.get(job_id)
    if not p.may_write(job):
        raise Forbidden(f"job {job_id} belongs to another user; {p.name!r} may not change it")
    return job


def audit(
    svc: Services,
    request: Request,
    p: Principal,
    action: str,
    target: str | None = None,
    **detail: object,
) -> None:
    """Record an action in the audit log (a failure to write it is logged, not raised)."""
    try:
        svc.store.accounts.audit(
            p.name, action, target, detail=dict(detail) or None, client=client_address(request)
        )
    except Exception:
        log.exception("could not write the audit log (%s %s)", action, target)
