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
import threading
import time
from collections import deque
from dataclasses import dataclass

from trainhouse.core.errors import RateLimited, TrainhouseError, Unauthorized
from trainhouse.core.records import Job
from trainhouse.core.tokens import JOB_TOKEN_PREFIX, USER_TOKEN_PREFIX, hash_token
from trainhouse.store.accounts import Accounts

CACHE_SECONDS = 5.0  # a verified user token is trusted this long without a query
WRITE_ROLES = ("admin", "member")


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    name: str  # a user's name; job:<id> for a job's credential
    role: str  # admin | member | viewer | job | open (auth off)
    job_id: int | None = None
    token_id: int | None = None
    #: the address the request came from (what the audit log records); "" outside a request
    client: str = ""

    def at(self, client: str) -> Principal:
        """This principal, calling from ``client`` (made directly: ``dataclasses.replace``
        costs each prediction a few microseconds more)."""
        return Principal(self.name, self.role, self.job_id, self.token_id, client)

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

    def cached(self, token: str) -> Principal | None:
        """The principal of a user token verified less than :data:`CACHE_SECONDS` ago (and
        not past its expiry since), without a query; None when it must be looked up."""
        with self._lock:
            hit = self._cache.get(hash_token(token))
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def user(self, token: str, client: str) -> Principal:
        hit = self.cached(token)
        if hit is not None:
            return hit
        key = hash_token(token)
        now = time.monotonic()
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


def job_credential(job: Job, token: str) -> bool:
    return job.token_hash is not None and hmac.compare_digest(hash_token(token), job.token_hash)
