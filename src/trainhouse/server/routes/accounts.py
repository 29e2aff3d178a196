"""Accounts: who am I, dashboard sessions, users and roles, API tokens, the audit log. The
work is :mod:`trainhouse.usecases.accounts`'s; these routes parse, call and render."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, Field

from trainhouse.server.auth import COOKIE, admin, caller, client_address, signed_in
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import NO_NUL, NulFree, RowId
from trainhouse.usecases import accounts
from trainhouse.usecases.access import Principal
from trainhouse.usecases.accounts import Role, Token, User
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
    p = accounts.sign_in(rt, body.token, client_address(request))
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
def list_users(p: Principal = Depends(admin), rt: Runtime = Depends(runtime)) -> UsersOut:
    return UsersOut(users=[user_out(u) for u in accounts.users(rt, p)])


@router.post("/users", response_model=UserOut, status_code=201)
def add_user(
    body: UserIn,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> UserOut:
    return user_out(accounts.add_user(rt, p, body.name, body.role))


@router.patch("/users/{name}", response_model=UserOut)
def update_user(
    name: Annotated[str, Path(pattern=NO_NUL)],
    body: UserPatch,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> UserOut:
    """Change a user's role, or disable (their tokens stop working) or enable them."""
    return user_out(accounts.update_user(rt, p, name, role=body.role, disabled=body.disabled))


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
    return TokensOut(tokens=[token_out(t) for t in accounts.tokens(rt, p, user=user, all=all)])


@router.post("/tokens", response_model=NewTokenOut, status_code=201)
def create_token(
    body: TokenIn,
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> NewTokenOut:
    """A new API token, for me or (admins) for another user; its secret is shown only here."""
    token, secret = accounts.create_token(
        rt, p, body.name, user=body.user, expires_in=body.expires_in
    )
    return NewTokenOut(token=token_out(token), secret=secret)


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke_token(
    token_id: RowId,
    p: Principal = Depends(signed_in),
    rt: Runtime = Depends(runtime),
) -> TokenOut:
    return token_out(accounts.revoke_token(rt, p, token_id))


# -- audit ----------------------------------------------------------------------------------
@router.get("/audit", response_model=AuditOut)
def audit_log(
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=10**12),
    action: list[NulFree] | None = Query(None, description="Only these actions (repeatable)"),
    actor: str | None = Query(None, max_length=128, pattern=NO_NUL),
    since: float | None = Query(None, ge=0, le=1e11, description="Unix time of the first entry"),
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> AuditOut:
    """Admin actions, cancellations and failed token uses, newest first."""
    entries, total = accounts.audit_log(
        rt, p, limit=limit, offset=offset, actions=action, actor=actor, since=since
    )
    return AuditOut(entries=[AuditEntryOut(**asdict(e)) for e in entries], total=total)
