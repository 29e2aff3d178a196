"""Secrets: API tokens for people and per-attempt credentials for jobs (standard library only).

A user's token is ``thu_`` + 43 random URL-safe characters (256 bits), shown once when it is
made (:func:`issue`); a job's ranks get ``thj_<job id>_...`` (:func:`job_token`), made afresh
for every attempt. Only a token's sha256 (:func:`hash_token`) is ever stored: with that much
entropy a slow password hash buys nothing, and a lookup by hash is one indexed query.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Protocol, TypeVar

__all__ = [
    "JOB_TOKEN_PREFIX",
    "USER_TOKEN_PREFIX",
    "hash_token",
    "issue",
    "job_of_token",
    "job_token",
    "shown_prefix",
]

USER_TOKEN_PREFIX = "thu_"
JOB_TOKEN_PREFIX = "thj_"
_SHOWN = len(USER_TOKEN_PREFIX) + 6  # characters of a token kept to tell tokens apart

T_co = TypeVar("T_co", covariant=True)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def shown_prefix(token: str) -> str:
    """The first characters of a token: enough to tell tokens apart, too few to use one."""
    return token[:_SHOWN]


def job_token(job_id: int) -> str:
    """A fresh per-attempt credential for a job's ranks; its job id is readable from it."""
    return f"{JOB_TOKEN_PREFIX}{job_id}_{secrets.token_urlsafe(32)}"


def job_of_token(token: str) -> int | None:
    """The job a ``thj_`` credential names (None for anything else)."""
    if not token.startswith(JOB_TOKEN_PREFIX):
        return None
    head, sep, _secret = token[len(JOB_TOKEN_PREFIX) :].partition("_")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses
    ok = sep and head.isascii() and head.isdigit() and len(head) <= 18
    return int(head) if ok else None


class TokenBook(Protocol[T_co]):
    """Where tokens are recorded (the store's accounts): by hash, never the secret."""

    def add_token(
        self,
        user: str,
        name: str,
        *,
        token_hash: str,
        prefix: str,
        expires_at: float | None = None,
    ) -> T_co: ...


def issue(
    book: TokenBook[T_co], user: str, name: str = "default", *, expires_at: float | None = None
) -> tuple[T_co, str]:
    """A new token for ``user``: its record and the secret, which is never seen again."""
    secret = USER_TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = book.add_token(
        user,
        name,
        token_hash=hash_token(secret),
        prefix=shown_prefix(secret),
        expires_at=expires_at,
    )
    return record, secret
