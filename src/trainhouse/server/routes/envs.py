"""The jobs' environments in this machine's cache (``HOME/envs``, :mod:`trainhouse.jobfs.envcache`):
list them, and remove those no attempt uses. Admins only."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from trainhouse.jobfs import envcache
from trainhouse.server.auth import admin, audit
from trainhouse.server.deps import runtime
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["environments"])


class EnvOut(BaseModel):
    digest: str
    size: int = Field(description="Bytes on disk")
    last_used: float = Field(description="Unix time a job last started with it")
    in_use: bool = Field(description="An attempt uses it now: it is never removed meanwhile")
    jobs: list[str] = Field(description='The attempts using it, as "<job>.<attempt>"')


class EnvsOut(BaseModel):
    envs: list[EnvOut]
    total_size: int
    max_size: int = Field(description="The cache's size (--env-cache-size)")
    directory: str


class PruneIn(BaseModel):
    model_config = {"extra": "forbid"}

    all: bool = Field(
        False,
        description="Remove every environment not in use, not only those past the cache's size",
    )
    digest: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[0-9a-f]{1,64}$",
        description="Remove this one only (a prefix of its digest)",
    )


class PruneOut(BaseModel):
    removed: list[EnvOut]
    kept_in_use: list[str] = Field(description="Digests that were asked for but are in use")


def _out(env: envcache.Cached) -> EnvOut:
    return EnvOut(**env.to_json())


@router.get("/envs", response_model=EnvsOut)
def list_envs(_p: Principal = Depends(admin), rt: Runtime = Depends(runtime)) -> EnvsOut:
    """This machine's environments, least recently used first (a Ray node keeps its own)."""
    found = envcache.cached(rt.settings.env_cache)
    return EnvsOut(
        envs=[_out(e) for e in found],
        total_size=sum(e.size for e in found),
        max_size=rt.settings.env_cache_size,
        directory=str(rt.settings.env_cache),
    )


@router.post("/envs/prune", response_model=PruneOut)
def prune_envs(
    request: Request,
    body: PruneIn,
    p: Principal = Depends(admin),
    rt: Runtime = Depends(runtime),
) -> PruneOut:
    """Remove environments no attempt uses: the least recently used past the cache's size,
    every one (``all``), or one (``digest``)."""
    cache = rt.settings.env_cache
    busy: list[str] = []
    if body.digest is not None:
        chosen = [e for e in envcache.cached(cache) if e.digest.startswith(body.digest)]
        removed = []
        for env in chosen:
            if envcache.remove(cache, env.digest):
                removed.append(env)
            else:
                busy.append(env.digest)
    else:
        removed = envcache.prune(cache, 0 if body.all else rt.settings.env_cache_size)
        busy = [] if not body.all else [e.digest for e in envcache.cached(cache) if e.in_use]
    audit(rt, request, p, "envcache.prune", str(len(removed)), **body.model_dump(exclude_none=True))
    return PruneOut(removed=[_out(e) for e in removed], kept_in_use=busy)
