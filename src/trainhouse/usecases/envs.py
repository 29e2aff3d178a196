"""The jobs' environments in this machine's cache (``HOME/envs``,
:mod:`trainhouse.jobfs.envcache`): list them, and remove those no attempt uses. Admins only
(the routes' dependency checks it); a removal is audited."""

from __future__ import annotations

from dataclasses import dataclass

from trainhouse.jobfs import envcache
from trainhouse.jobfs.envcache import Cached
from trainhouse.usecases import audit
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

__all__ = ["EnvCache", "Pruned", "listing", "prune"]


@dataclass(frozen=True)
class EnvCache:
    """The cache's environments, least recently used first, their bytes on disk in all, the
    cache's size (``--env-cache-size``) and its directory."""

    envs: list[Cached]
    total_size: int
    max_size: int
    directory: str


@dataclass(frozen=True)
class Pruned:
    """The environments removed, and the digests asked for that are in use (kept)."""

    removed: list[Cached]
    kept_in_use: list[str]


def listing(rt: Runtime) -> EnvCache:
    """This machine's environments, least recently used first (a Ray node keeps its own)."""
    found = envcache.cached(rt.settings.env_cache)
    return EnvCache(
        envs=found,
        total_size=sum(e.size for e in found),
        max_size=rt.settings.env_cache_size,
        directory=str(rt.settings.env_cache),
    )


def prune(rt: Runtime, p: Principal, *, all: bool = False, digest: str | None = None) -> Pruned:
    """Remove environments no attempt uses: the least recently used past the cache's size,
    every one (``all``), or those whose digest starts with ``digest``. The files go first
    (no transaction holds a file system); the audit entry records what was asked."""
    cache = rt.settings.env_cache
    busy: list[str] = []
    if digest is not None:
        chosen = [e for e in envcache.cached(cache) if e.digest.startswith(digest)]
        removed = []
        for env in chosen:
            if envcache.remove(cache, env.digest):
                removed.append(env)
            else:
                busy.append(env.digest)
    else:
        removed = envcache.prune(cache, 0 if all else rt.settings.env_cache_size)
        busy = [] if not all else [e.digest for e in envcache.cached(cache) if e.in_use]
    asked: dict[str, object] = {"all": all} | ({"digest": digest} if digest is not None else {})
    audit.record(rt, p, "envcache.prune", str(len(removed)), **asked)
    return Pruned(removed=removed, kept_in_use=busy)
