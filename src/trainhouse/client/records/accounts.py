"""Records of users, tokens and the audit log.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import TypedDict

__all__ = [
    "AuditEntry",
    "AuditPage",
    "NewToken",
    "Token",
    "TokenList",
    "User",
    "UserList",
    "WhoAmI",
]


# -- accounts --------------------------------------------------------------------------------
class WhoAmI(TypedDict):
    """``WhoAmIOut``: who the server takes the caller for."""

    name: str
    role: str
    job_id: int | None
    auth: bool
    job_visibility: str


class User(TypedDict):
    """``UserOut``."""

    name: str
    role: str
    created_at: float
    disabled_at: float | None


class UserList(TypedDict):
    """``UsersOut``: ``GET /users``."""

    users: list[User]


class Token(TypedDict):
    """``TokenOut``: an API token, without its secret."""

    id: int
    user: str
    name: str
    prefix: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    active: bool


class TokenList(TypedDict):
    """``TokensOut``: ``GET /tokens``."""

    tokens: list[Token]


class NewToken(TypedDict):
    """``NewTokenOut``: a new token and its secret (shown once)."""

    token: Token
    secret: str


class AuditEntry(TypedDict):
    """``AuditEntryOut``: an entry of the audit log."""

    id: int
    at: float
    actor: str
    action: str
    target: str | None
    ok: bool
    detail: dict[str, object] | None
    client: str | None


class AuditPage(TypedDict):
    """``AuditOut``: a page of the audit log."""

    entries: list[AuditEntry]
    total: int
