"""Accounts: dashboard sign-in, users and their roles, API tokens, and reading the audit log.
Each change is one transaction with its audit entry; after a change that can turn a token
away (a role, a disabled user, a revocation) the authenticator forgets the tokens it had
verified, so the next request is checked afresh. Users and the audit log are for admins; a
token is its user's (and any admin's)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from trainhouse.core.errors import Forbidden, Unauthorized
from trainhouse.core.tokens import JOB_TOKEN_PREFIX, issue
from trainhouse.store.accounts import AuditEntry, Role, Token, User
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

__all__ = [
    "AuditEntry",
    "Role",
    "Token",
    "User",
    "add_user",
    "audit_log",
    "create_token",
    "revoke_token",
    "sign_in",
    "tokens",
    "update_user",
    "users",
]


def _admin(p: Principal) -> None:
    """Refuse ``p`` unless it is an admin (as :func:`trainhouse.server.auth.admin` does)."""
    if not p.is_admin:
        raise Forbidden(f"only admins may do this; user {p.name!r} is a {p.role}")


def sign_in(rt: Runtime, token: str, client: str) -> Principal:
    """Whoever ``token`` (a person's, not a job's credential) names, for a dashboard session
    opened from ``client`` (auth on: the route answers for auth off). A refused token is
    refused as any is (401, 429 past the failure limit)."""
    if token.startswith(JOB_TOKEN_PREFIX):
        raise Forbidden("a job's credential cannot open a dashboard session")
    return rt.auth.user(token.strip(), client)


# -- users ----------------------------------------------------------------------------------
def users(rt: Runtime, p: Principal) -> list[User]:
    """Every user, by name (admins only)."""
    _admin(p)
    return rt.store.accounts.users()


def add_user(rt: Runtime, p: Principal, name: str, role: Role) -> User:
    """A new user with ``role`` (admins only); they sign in with a token made for them."""
    _admin(p)
    with rt.store.transaction():
        user = rt.store.accounts.add_user(name, role)
        audit.record(rt, p, "user.add", user.name, role=user.role)
    return user


def update_user(
    rt: Runtime,
    p: Principal,
    name: str,
    *,
    role: Role | None = None,
    disabled: bool | None = None,
) -> User:
    """Change a user's role, or disable (their tokens stop working) or enable them (admins
    only); the last active admin stays one. The audit entry records the fields given."""
    _admin(p)
    changes = {k: v for k, v in (("role", role), ("disabled", disabled)) if v is not None}
    with rt.store.transaction():
        user = rt.store.accounts.update_user(name, role=role, disabled=disabled)
        audit.record(rt, p, "user.update", name, **changes)
    rt.auth.forget()
    return user


# -- tokens ---------------------------------------------------------------------------------
def tokens(rt: Runtime, p: Principal, *, user: str | None = None, all: bool = False) -> list[Token]:
    """``user``'s tokens (default: the caller's), or every user's (``all``); another user's
    are for admins only."""
    if (all or (user is not None and user != p.name)) and not p.is_admin:
        raise Forbidden(f"only admins may list other users' tokens; user {p.name!r} is a {p.role}")
    return rt.store.accounts.tokens(None if all else (user or p.name))


def create_token(
    rt: Runtime,
    p: Principal,
    name: str,
    *,
    user: str | None = None,
    expires_in: float | None = None,
) -> tuple[Token, str]:
    """A new API token named ``name`` for the caller or (admins) for ``user``, expiring in
    ``expires_in`` seconds (None: never); its record and its secret, which is never seen
    again. With auth off there is no caller to make one for: ``user`` must be named."""
    whose = user or p.name
    if whose != p.name and not p.is_admin:
        raise Forbidden(f"only admins may make tokens for other users; {p.name!r} is a {p.role}")
    if not p.authenticated and user is None:
        raise Unauthorized("auth is off here, so there is no 'me': name the token's user")
    expires_at = time.time() + expires_in if expires_in else None
    with rt.store.transaction():
        token, secret = issue(rt.store.accounts, whose, name, expires_at=expires_at)
        audit.record(
            rt,
            p,
            "token.create",
            whose,
            token_id=token.id,
            name=token.name,
            expires_at=expires_at,
        )
    return token, secret


def revoke_token(rt: Runtime, p: Principal, token_id: int) -> Token:
    """Revoke one of the caller's tokens (admins: anyone's); it stops working at once."""
    with rt.store.transaction():
        token = rt.store.accounts.get_token(token_id)
        if token.user != p.name and not p.is_admin:
            raise Forbidden(
                f"token {token_id} belongs to another user; {p.name!r} may not revoke it"
            )
        token = rt.store.accounts.revoke_token(token_id)
        audit.record(rt, p, "token.revoke", token.user, token_id=token_id)
    rt.auth.forget()
    return token


# -- audit ----------------------------------------------------------------------------------
def audit_log(
    rt: Runtime,
    p: Principal,
    *,
    limit: int = 100,
    offset: int = 0,
    actions: Sequence[str] | None = None,
    actor: str | None = None,
    since: float | None = None,
) -> tuple[list[AuditEntry], int]:
    """A page of the audit log (admin actions, cancellations, failed token uses), newest
    first, and how many entries match (admins only)."""
    _admin(p)
    return rt.store.accounts.audit_entries(
        limit=limit, offset=offset, actions=actions, actor=actor, since=since
    )
