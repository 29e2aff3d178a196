"""The jobs' environments in this machine's cache (``HOME/envs``, :mod:`trainhouse.jobfs.envcache`):
list them, and remove those no attempt uses. Admins only. The work is
:mod:`trainhouse.usecases.envs`'s; these routes parse, call and render."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from trainhouse.jobfs.envcache import Cached
from trainhouse.server.auth import admin
from trainhouse.server.deps import runtime
from trainhouse.usecases import envs
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


def _out(env: Cached) -> EnvOut:
    return EnvOut(**env.to_json())


@router.get("/envs", response_model=EnvsOut)
def list_envs(_p: Principal = Depends(admin), rt: Runtime = Depends(runtime)) -> EnvsOut:
    """This machine's environments, least recently used first (a Ray node keeps its own)."""
    found = envs.listing(rt)
    return EnvsOut(
        envs=[_out(e) for e in found.envs],
        total_size=found.total_size,
        max_size=found.max_size,
        directory=found.directory,
    )


@router.post("/envs/prune", response_model=PruneOut)
def prune_envs(
    body: PruneIn, p: Principal = Depends(admin), rt: Runtime = Depends(runtime)
) -> PruneOut:
    """Remove environments no attempt uses: the least recently used past the cache's size,
    every one (``all``), or one (``digest``)."""
    done = envs.prune(rt, p, all=body.all, digest=body.digest)
    return PruneOut(removed=[_out(e) for e in done.removed], kept_in_use=done.kept_in_use)
