"""The cache of job environments on one node (:mod:`trainhouse.executors.node.envbuild` builds
them): what is in it, what is in use, and the least recently used removal past its size.

An environment is ready once its directory holds ``READY``; ``USED`` is touched whenever an
attempt starts with it. Every attempt using one holds ``.locks/<digest>.use`` shared; removal
takes it exclusively (without waiting), so an environment in use is never removed, and a
half-removed one is never taken for ready (its marker goes first). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["READY", "USED", "Cached", "cached", "is_ready", "lock_file", "prune", "remove"]

READY = ".trainhouse-ready"
USED = ".trainhouse-used"


def lock_file(cache: Path, name: str) -> IO[bytes]:
    locks = cache / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    return open(locks / name, "ab")


def is_ready(path: Path) -> bool:
    return (path / READY).is_file()


@dataclass(frozen=True)
class Cached:
    """One ready environment of a cache."""

    digest: str
    size: int  # bytes
    last_used: float  # epoch seconds
    in_use: bool
    jobs: list[str]  # "<job>.<attempt>" of the attempts using it

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _in_use(cache: Path, key: str) -> bool:
    try:
        lock = lock_file(cache, f"{key}.use")
    except OSError:
        return False
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _users(cache: Path, key: str, in_use: bool) -> list[str]:
    users = cache / ".users" / key
    if not in_use:  # what attempts killed before their release left
        shutil.rmtree(users, ignore_errors=True)
        return []
    with contextlib.suppress(OSError):
        return sorted(p.name for p in users.iterdir())
    return []


def cached(cache: Path) -> list[Cached]:
    """The ready environments of ``cache``, least recently used first."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(cache):
            path = Path(entry.path)
            if entry.name.startswith(".") or not is_ready(path):
                continue
            try:
                used = (path / USED).stat().st_mtime
            except OSError:
                used = (path / READY).stat().st_mtime
            busy = _in_use(cache, entry.name)
            found.append(
                Cached(entry.name, _size(path), used, busy, _users(cache, entry.name, busy))
            )
    return sorted(found, key=lambda c: c.last_used)


def remove(cache: Path, key: str) -> bool:
    """Remove one environment unless an attempt uses it (its use lock, taken exclusively for
    the removal); True if removed."""
    if key.startswith(".") or "/" in key or not (cache / key).is_dir():
        return False
    with lock_file(cache, f"{key}.use") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # not ready first: a half-removed environment is never taken for a ready one
        with contextlib.suppress(OSError):
            (cache / key / READY).unlink()
        shutil.rmtree(cache / key, ignore_errors=True)
        shutil.rmtree(cache / ".users" / key, ignore_errors=True)
        return True


def prune(cache: Path, max_size: int, *, out: Callable[[str], None] | None = None) -> list[Cached]:
    """Remove least recently used environments not in use until the cache holds at most
    ``max_size`` bytes (0: every one not in use); the ones removed."""
    envs = cached(cache)
    total = sum(e.size for e in envs)
    removed = []
    for env in envs:
        if total <= max_size:
            break
        if env.in_use or not remove(cache, env.digest):
            continue
        total -= env.size
        removed.append(env)
        if out is not None:
            out(f"trainhouse: removed environment {env.digest[:12]} (least recently used)")
    return removed
