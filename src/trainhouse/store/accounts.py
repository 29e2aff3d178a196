"""Accounts (``store.accounts``): users with a role, their API tokens (stored as hashes only)
and the audit log.

Tokens are made and hashed by :mod:`trainhouse.core.tokens`; this module records only a token's
sha256 and its first characters. A job's ranks get a separate, per-attempt credential that is
kept on the job row, not here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from trainhouse.core.errors import NotFound, SpecError, StoreError
from trainhouse.core.tokens import hash_token
from trainhouse.store import tables as t

if TYPE_CHECKING:
    from trainhouse.store.database import Database

Role = Literal["admin", "member", "viewer"]
ROLES: tuple[str, ...] = get_args(Role)
NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,63}$")
TOKEN_NAME_RE = re.compile(r"^[\w.@:+-]{1,64}$")
LAST_USED_EVERY = 60.0  # seconds between writes of a token's last_used_at
MAX_AUDIT_DETAIL = 2000  # characters of a detail value kept


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise SpecError(
            "a user name is 1-64 characters: lower-case letters, digits, '_', '.', '-', "
            f"starting with a letter or '_'; got {name!r}"
        )
    return name


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise SpecError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    return role  # type: ignore[return-value]


@dataclass(frozen=True)
class User:
    id: int
    name: str
    role: Role
    created_at: float
    disabled_at: float | None = None

    @property
    def active(self) -> bool:
        return self.disabled_at is None


@dataclass(frozen=True)
class Token:
    id: int
    user: str
    name: str
    prefix: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None

    def active(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: float
    actor: str
    action: str
    target: str | None
    ok: bool
    detail: dict[str, Any] | None
    client: str | None


def _user(row: RowMapping) -> User:
    return User(**{k: row[k] for k in User.__dataclass_fields__})


def _audit_entry(row: RowMapping) -> AuditEntry:
    data: dict[str, Any] = {k: row[k] for k in AuditEntry.__dataclass_fields__}
    data["ok"] = bool(data["ok"])  # SQLite keeps a boolean as 0/1
    return AuditEntry(**data)


def _token(row: RowMapping) -> Token:
    return Token(**{k: row[k] for k in Token.__dataclass_fields__})


def _token_query() -> Any:
    return select(
        t.api_tokens.c.id,
        t.users.c.name.label("user"),
        t.api_tokens.c.name,
        t.api_tokens.c.prefix,
        t.api_tokens.c.created_at,
        t.api_tokens.c.expires_at,
        t.api_tokens.c.revoked_at,
        t.api_tokens.c.last_used_at,
    ).join(t.users, t.users.c.id == t.api_tokens.c.user_id)


def _clip(value: Any) -> Any:
    return value[:MAX_AUDIT_DETAIL] if isinstance(value, str) else value


class Accounts:
    """Users, tokens and the audit log."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._last_used: dict[int, float] = {}

    # -- users ------------------------------------------------------------------------------
    def add_user(self, name: str, role: str = "member") -> User:
        check_name(name)
        role = check_role(role)
        try:
            with self.db.transaction() as conn:
                conn.execute(insert(t.users).values(name=name, role=role, created_at=time.time()))
        except IntegrityError:
            raise StoreError(f"user {name!r} already exists") from None
        return self.get_user(name)

    def get_user(self, name: str) -> User:
        with self.db.transaction() as conn:
            row = conn.execute(select(t.users).where(t.users.c.name == name)).mappings().first()
        if row is None:
            raise NotFound(f"user {name!r} does not exist")
        return _user(row)

    def users(self) -> list[User]:
        with self.db.transaction() as conn:
            rows = conn.execute(select(t.users).order_by(t.users.c.name)).mappings().all()
        return [_user(r) for r in rows]

    def _active_admins(self, conn: Connection) -> int:
        return int(
            conn.execute(
                select(func.count())
                .select_from(t.users)
                .where(t.users.c.role == "admin", t.users.c.disabled_at.is_(None))
            ).scalar_one()
        )

    def has_admin(self) -> bool:
        with self.db.transaction() as conn:
            return self._active_admins(conn) > 0

    def update_user(
        self, name: str, *, role: str | None = None, disabled: bool | None = None
    ) -> User:
        """Change a user's role or disable/enable them; the last active admin stays one."""
        if role is not None:
            role = check_role(role)
        with self.db.transaction() as conn:
            row = conn.execute(select(t.users).where(t.users.c.name == name)).mappings().first()
            if row is None:
                raise NotFound(f"user {name!r} does not exist")
            user = _user(row)
            values: dict[str, Any] = {}
            if role is not None:
                values["role"] = role
            if disabled is not None:
                values["disabled_at"] = (user.disabled_at or time.time()) if disabled else None
            if not values:  # nothing to change (an UPDATE with no SET is not SQL)
                return user
            conn.execute(update(t.users).where(t.users.c.id == user.id).values(**values))
            if user.role == "admin" and user.active and self._active_admins(conn) == 0:
                raise StoreError(
                    f"{name!r} is the last active admin; make another user admin first"
                )
        return self.get_user(name)

    # -- tokens -----------------------------------------------------------------------------
    def add_token(
        self,
        user: str,
        name: str,
        *,
        token_hash: str,
        prefix: str,
        expires_at: float | None = None,
    ) -> Token:
        """Record a token made by :func:`trainhouse.core.tokens.issue` (its hash, never itself)."""
        if not TOKEN_NAME_RE.match(name):
            raise SpecError(
                f"a token name is 1-64 letters, digits or _.@:+- characters; got {name!r}"
            )
        now = time.time()
        if expires_at is not None and expires_at <= now:
            raise SpecError("a token's expiry must lie in the future")
        owner = self.get_user(user)
        if not owner.active:
            raise StoreError(f"user {user!r} is disabled")
        with self.db.transaction() as conn:
            token_id = conn.execute(
                insert(t.api_tokens)
                .values(
                    user_id=owner.id,
                    name=name,
                    hash=token_hash,
                    prefix=prefix,
                    created_at=now,
                    expires_at=expires_at,
                )
                .returning(t.api_tokens.c.id)
            ).scalar_one()
        return self.get_token(int(token_id))

    def get_token(self, token_id: int) -> Token:
        with self.db.transaction() as conn:
            row = (
                conn.execute(_token_query().where(t.api_tokens.c.id == token_id)).mappings().first()
            )
        if row is None:
            raise NotFound(f"token {token_id} does not exist")
        return _token(row)

    def tokens(self, user: str | None = None) -> list[Token]:
        query = _token_query().order_by(t.api_tokens.c.id)
        if user is not None:
            query = query.where(t.users.c.name == user)
        with self.db.transaction() as conn:
            return [_token(r) for r in conn.execute(query).mappings().all()]

    def revoke_token(self, token_id: int) -> Token:
        token = self.get_token(token_id)
        if token.revoked_at is None:
            with self.db.transaction() as conn:
                conn.execute(
                    update(t.api_tokens)
                    .where(t.api_tokens.c.id == token_id)
                    .values(revoked_at=time.time())
                )
        return self.get_token(token_id)

    def authenticate(self, secret: str) -> tuple[User, Token] | str:
        """The user and token a secret belongs to, or why it does not work."""
        with self.db.transaction() as conn:
            row = (
                conn.execute(
                    select(
                        t.api_tokens,
                        t.users.c.name.label("user"),
                        t.users.c.role,
                        t.users.c.created_at.label("user_created_at"),
                        t.users.c.disabled_at,
                    )
                    .join(t.users, t.users.c.id == t.api_tokens.c.user_id)
                    .where(t.api_tokens.c.hash == hash_token(secret))
                )
                .mappings()
                .first()
            )
        if row is None:
            return "unknown token"
        token = _token(row)
        user = User(
            id=row["user_id"],
            name=row["user"],
            role=row["role"],
            created_at=row["user_created_at"],
            disabled_at=row["disabled_at"],
        )
        now = time.time()
        if token.revoked_at is not None:
            return f"token {token.id} was revoked"
        if token.expires_at is not None and token.expires_at <= now:
            return f"token {token.id} expired"
        if not user.active:
            return f"user {user.name!r} is disabled"
        if now - self._last_used.get(token.id, 0.0) >= LAST_USED_EVERY:
            self._last_used[token.id] = now
            with self.db.transaction() as conn:
                conn.execute(
                    update(t.api_tokens)
                    .where(t.api_tokens.c.id == token.id)
                    .values(last_used_at=now)
                )
        return user, token

    # -- audit ------------------------------------------------------------------------------
    def audit(
        self,
        actor: str,
        action: str,
        target: str | None = None,
        *,
        ok: bool = True,
        detail: dict[str, Any] | None = None,
        client: str | None = None,
    ) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                insert(t.audit_log).values(
                    at=time.time(),
                    actor=actor[:128],
                    action=action[:64],
                    target=target[:256] if target else None,
                    ok=ok,
                    detail={k: _clip(v) for k, v in detail.items()} if detail else None,
                    client=client[:64] if client else None,
                )
            )

    def audit_entries(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        actions: Sequence[str] | None = None,
        actor: str | None = None,
        since: float | None = None,
    ) -> tuple[list[AuditEntry], int]:
        """A page of the audit log, newest first, and how many entries match."""
        where: list[ColumnElement[bool]] = []
        if actions:
            where.append(t.audit_log.c.action.in_(list(actions)))
        if actor:
            where.append(t.audit_log.c.actor == actor)
        if since is not None:
            where.append(t.audit_log.c.at >= since)
        with self.db.transaction() as conn:
            rows = (
                conn.execute(
                    select(t.audit_log)
                    .where(*where)
                    .order_by(t.audit_log.c.id.desc())
                    .limit(limit)
                    .offset(offset)
                )
                .mappings()
                .all()
            )
            total = conn.execute(
                select(func.count()).select_from(t.audit_log).where(*where)
            ).scalar_one()
        return [_audit_entry(r) for r in rows], int(total)
