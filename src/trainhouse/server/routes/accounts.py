"""Accounts: who am I, dashboard sessions, users and roles, API tokens, the audit log."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field

from trainhouse.core.errors import Forbidden, Unauthorized
from trainhouse.core.tokens import issue
from trainhouse.server.auth import COOKIE, admin, audit, caller, client_address, signed_in
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import NO_NUL, NulFree, RowId
from trainhouse.store.accounts import Role, Token, User
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["accounts"])

MAX_TOKEN_LIFETIME = 10 * 365 * 86400.0


class WhoAmIOut(BaseModel):
    name: str
    role: str = Field(description="admin | member | viewer | job | open (auth is off)")
    job_id: int | None = None
    auth: bool = Field(description="Whether this server checks tokens")
    job_visibility: str


class UserOut(BaseModel):
    name: str
    role: str
    created_at: float
    disabled_at: float | None


class UsersOut(BaseModel):
    users: list[UserOut]


class UserIn(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    role: Role = "member"


class UserPatch(BaseModel):
    role: Role | None = None
    disabled: bool | None = None


class TokenOut(BaseModel):
    id: int
    user: str
    name: str
    prefix: str = Field(description="The token's first characters, to tell tokens apart")
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    active: bool


class TokensOut(BaseModel):
    tokens: list[TokenOut]


class TokenIn(BaseModel):
    name: str = Field("default", min_length=1, max_length=64)
    user: str | None = Field(
        None, max_length=64, pattern=NO_NUL, description="Whose token (admins); default: me"
    )
    expires_in: float | None = Field(
        None, gt=0, le=MAX_TOKEN_LIFETIME, description="Seconds until it expires; null: never"
    )


class NewTokenOut(BaseModel):
    token: TokenOut
    secret: str = Field(description="The token itself: shown once, never stored")


class SessionIn(BaseModel):
    token: str = Field(min_length=1, max_length=256)


class AuditEntryOut(BaseModel):
    id: int
    at: float
    actor: str
    action: str
    target: str | None
    ok: bool
    detail: dict[str, object] | None
    client: str | None


class AuditOut(BaseModel):
    entries: list[AuditEntryOut]
    total: int


def user_out(user: User) -> UserOut:
    return UserOut(
        name=user.name, role=user.role, created_at=user.created_at, disabled_at=user.disabled_at
    )


def token_out(token: Token) -> TokenOut:
    return TokenOut(**asdict(token), active=token.active())


@router.get("/whoami", response_model=WhoAmIOut)
def whoami(p: Principal = Depends(caller), rt: Runtime = Depends(runtime)) -> WhoAmIOut:
    """The caller as the server sees it (``trainhouse login`` checks a token with it)."""
    return WhoAmIOut(
        name=p.name,
        role=p.role,
        job_id=p.job_id,
        auth=rt.auth.enabled,
        job_visibility=rt.settings.job_visibility,
    )


@router.post("/session", response_model=WhoAmIOut)
def open_session(
    request: Request,
    response: Response,
    body: SessionIn,
    rt: Runtime = Depends(runtime),
) -> WhoAmIOut:
    """Sign the dashboard in: the token goes into an HttpOnly, SameSite=Strict cookie."""
    if not rt.auth.enabled:
        return WhoAmIOut(
            name="anonymous", role="open", auth=False, job_visibility=rt.settings.job_visibility
        )
    if body.token.startswith("thj_"):
        raise Forbidden("a job's credential cannot open a dashboard session")
    p = rt.auth.user(body.token.strip(), client_address(request))
    response.set_cookie(
        COOKIE,
        body.token.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return WhoAmIOut(name=p.name, role=p.role, auth=True, job_visibility=rt.settings.job_visibility)


@router.delete("/session", status_code=204)
def close_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/")


# -- users ----------------------------------------------------------------------------------
@router.get("/users", response_model=UsersOut)
def list_users(_p: Principal = Depends(admin), rt: Runtime = Depends(runtime)) -> UsersOut:
    return UsersOut(users=[user_out(u) for u in rt.store.accounts.users()])


@router.post("/users", response_model=UserOut, status_code=201)
def add_user(
    request: Request,
    body: UserIn,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> UserOut:
    user = rt.store.accounts.add_user(body.name, body.role)
    audit(rt, request, p, "user.add", user.name, role=user.role)
    return user_out(user)


@router.patch("/users/{name}", response_model=UserOut)
def update_user(
    request: Request,
    name: Annotated[str, Path(pattern=NO_NUL)],
    body: UserPatch,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> UserOut:
    """Change a user's role, or disable (their tokens stop working) or enable them."""
    user = rt.store.accounts.update_user(name, role=body.role, disabled=body.disabled)
    rt.auth.forget()
    audit(rt, request, p, "user.update", name, **body.model_dump(exclude_none=True))
    return user_out(user)


# -- tokens ---------------------------------------------------------------------------------
@router.get("/tokens", response_model=TokensOut)
def list_tokens(
    user: str | None = Query(
        None, max_length=64, pattern=NO_NUL, description="Whose (admins); default: mine"
    ),
    all: bool = Query(False, description="Every user's tokens (admins)"),
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> TokensOut:
    if (all or (user is not None and user != p.name)) and not p.is_admin:
        raise Forbidden(f"only admins may list other users' tokens; user {p.name!r} is a {p.role}")
    whose = None if all else (user or p.name)
    return TokensOut(tokens=[token_out(t) for t in rt.store.accounts.tokens(whose)])


@router.post("/tokens", response_model=NewTokenOut, status_code=201)
def create_token(
    request: Request,
    body: TokenIn,
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> NewTokenOut:
    """A new API token, for me or (admins) for another user; its secret is shown only here."""
    whose = body.user or p.name
    if whose != p.name and not p.is_admin:
        raise Forbidden(f"only admins may make tokens for other users; {p.name!r} is a {p.role}")
    if not p.authenticated and body.user is None:
        raise Unauthorized("auth is off here, so there is no 'me': name the token's user")
    expires_at = time.time() + body.expires_in if body.expires_in else None
    token, secret = issue(rt.store.accounts, whose, body.name, expires_at=expires_at)
    audit(
        rt,
        request,
        p,
        "token.create",
        whose,
        token_id=token.id,
        name=token.name,
        expires_at=expires_at,
    )
    return NewTokenOut(token=token_out(token), secret=secret)


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke_token(
    request: Request,
    token_id: RowId,
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> TokenOut:
    token = rt.store.accounts.get_token(token_id)
    if token.user != p.name and not p.is_admin:
        raise Forbidden(f"token {token_id} belongs to another user; {p.name!r} may not revoke it")
    token = rt.store.accounts.revoke_token(token_id)
    rt.auth.forget()
    audit(rt, request, p, "token.revoke", token.user, token_id=token_id)
    return token_out(token)


# -- audit ----------------------------------------------------------------------------------
@router.get("/audit", response_model=AuditOut)
def audit_log(
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=10**12),
    action: list[NulFree] | None = Query(None, description="Only these actions (repeatable)"),
    actor: str | None = Query(None, max_length=128, pattern=NO_NUL),
    since: float | None = Query(None, ge=0, le=1e11, description="Unix time of the first entry"),
    _p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> AuditOut:
    """Admin actions, cancellations and failed token uses, newest first."""
    entries, total = rt.store.accounts.audit_entries(
        limit=limit, offset=offset, actions=action, actor=actor, since=since
    )
    return AuditOut(entries=[AuditEntryOut(**asdict(e)) for e in entries], total=total)
