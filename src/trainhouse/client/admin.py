"""The client's calls about accounts and the server's administration: who am I, users, API
tokens, the audit log, per-user quotas and the cache of job environments. A part of
:class:`trainhouse.client.Client`."""

from __future__ import annotations

from typing import Any

from trainhouse.client.base import ClientBase
from trainhouse.client.records import (
    AuditPage,
    Envs,
    Limits,
    NewToken,
    Pruned,
    Quotas,
    Token,
    TokenList,
    User,
    UserList,
    WhoAmI,
)

__all__ = ["AdminCalls"]


class AdminCalls(ClientBase):
    """The calls about accounts, quotas and environments; :class:`~trainhouse.client.Client`
    has them."""

    # -- accounts --------------------------------------------------------------------------
    def whoami(self) -> WhoAmI:
        result: WhoAmI = self._json("GET", "/whoami")
        return result

    def users(self) -> list[User]:
        page: UserList = self._json("GET", "/users")
        return page["users"]

    def add_user(self, name: str, role: str = "member") -> User:
        result: User = self._json("POST", "/users", json={"name": name, "role": role})
        return result

    def update_user(
        self, name: str, *, role: str | None = None, disabled: bool | None = None
    ) -> User:
        body = {k: v for k, v in {"role": role, "disabled": disabled}.items() if v is not None}
        result: User = self._json("PATCH", f"/users/{name}", json=body)
        return result

    def tokens(self, *, user: str | None = None, all: bool = False) -> list[Token]:
        params: dict[str, Any] = {"all": str(all).lower()}
        if user:
            params["user"] = user
        page: TokenList = self._json("GET", "/tokens", params=params)
        return page["tokens"]

    def create_token(
        self, name: str = "default", *, user: str | None = None, expires_in: float | None = None
    ) -> NewToken:
        """A new token: ``{"token": {...}, "secret": "thu_..."}``; the secret is shown once."""
        body: dict[str, Any] = {"name": name, "user": user, "expires_in": expires_in}
        result: NewToken = self._json("POST", "/tokens", json=body)
        return result

    def revoke_token(self, token_id: int) -> Token:
        result: Token = self._json("DELETE", f"/tokens/{token_id}")
        return result

    def audit(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        actions: list[str] | None = None,
        actor: str | None = None,
        since: float | None = None,
    ) -> AuditPage:
        params: dict[str, Any] = {"limit": limit, "offset": offset, "action": actions or []}
        if actor:
            params["actor"] = actor
        if since is not None:
            params["since"] = since
        result: AuditPage = self._json("GET", "/audit", params=params)
        return result

    # -- quotas ----------------------------------------------------------------------------
    def quotas(self) -> Quotas:
        result: Quotas = self._json("GET", "/quotas")
        return result

    def set_quota(self, owner: str, limits: dict[str, Any]) -> Limits:
        result: Limits = self._json("PUT", f"/quotas/{owner}", json=limits)
        return result

    def clear_quota(self, owner: str) -> None:
        self._request("DELETE", f"/quotas/{owner}")

    # -- environments (admins) -------------------------------------------------------------
    def envs(self) -> Envs:
        """The server machine's cache of job environments: ``envs``, ``total_size``, ..."""
        result: Envs = self._json("GET", "/envs")
        return result

    def prune_envs(self, *, all: bool = False, digest: str | None = None) -> Pruned:
        """Remove environments no attempt uses (past the cache's size, ``all``, or one)."""
        body: dict[str, Any] = {"all": all}
        if digest is not None:
            body["digest"] = digest
        result: Pruned = self._json("POST", "/envs/prune", json=body)
        return result
