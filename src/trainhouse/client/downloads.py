"""Verified downloads, the one tail a checkpoint's and a model version's downloads share: each
file streamed into a temporary name next to the destination while it is hashed, every digest
checked, and only then the whole renamed into place. A partial or corrupt download never stays
under the final name.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trainhouse.core.errors import ClientError, ServerUnreachable

__all__ = ["Part", "discard", "fetch_verified", "stream_to"]

#: (name as listed, hex digest, size) of each file downloaded
Entries = list[tuple[str, str, int]]


@dataclass(frozen=True)
class Part:
    """One file of a download."""

    name: str  # as the server lists it (what the entries hold)
    target: str  # where it lands, relative to the download; "": the download is this file
    url: str
    algorithm: str = "sha256"  # what its digest is made with
    expected: str | None = None  # its digest, checked as soon as it is in; None: not one alone
    params: dict[str, str] | None = None


def _corrupt(part: Part, actual: str) -> Exception:
    return ClientError(
        f"the downloaded {part.name} has digest {actual[:16]}..., not the registered "
        f"{str(part.expected)[:16]}...: it is corrupt"
    )


def discard(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def stream_to(
    http: httpx.Client,
    url: str,
    target: Path,
    digest: Any,
    done: int,
    total: int,
    progress: Callable[[int, int], None] | None,
    refused: Callable[[httpx.Response], Exception],
    *,
    params: dict[str, str] | None = None,
) -> int:
    """Stream ``url`` into ``target``, feeding ``digest`` and ``progress(done, total)`` as it
    goes; the bytes done after it. A non-200 answer raises ``refused(response)``."""
    with http.stream("GET", url, params=params) as resp, target.open("wb") as out:
        if resp.status_code != 200:
            resp.read()
            raise refused(resp)
        for chunk in resp.iter_bytes(1 << 20):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return done


def fetch_verified(
    http: httpx.Client,
    server: str,
    final: Path,
    parts: Sequence[Part],
    *,
    total: int,
    progress: Callable[[int, int], None] | None,
    refused: Callable[[httpx.Response, Part], Exception],
    corrupt: Callable[[Part, str], Exception] | None = None,
    check: Callable[[Entries], None] | None = None,
) -> Path:
    """Download ``parts`` as ``final`` (a file, or a directory of them); returns ``final``.

    ``progress(done, total)`` in bytes. A part with an ``expected`` digest that arrives with
    another raises ``corrupt(part, actual)`` at once (a :class:`ClientError`
    without it); ``check(entries)`` then sees every file's digest and raises if the
    whole is not what was registered. Until both pass the download is a temporary name beside
    ``final`` (removed on any error); an existing ``final`` directory is replaced. ``server``
    names the server in :class:`ServerUnreachable` when the connection fails."""
    from trainhouse.jobfs.storage import new_hash

    tmp = final.parent / f".{final.name}.download-{os.getpid()}"
    entries: Entries = []
    done = 0
    try:
        for part in parts:
            target = tmp / part.target if part.target else tmp
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = new_hash(part.algorithm)

            def refuse(resp: httpx.Response, part: Part = part) -> Exception:
                return refused(resp, part)

            done = stream_to(
                http, part.url, target, digest, done, total, progress, refuse, params=part.params
            )
            actual = str(digest.hexdigest())
            if part.expected is not None and actual != part.expected:
                raise (corrupt or _corrupt)(part, actual)
            entries.append((part.name, actual, target.stat().st_size))
        if check is not None:
            check(entries)
        if final.is_dir():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except httpx.HTTPError as exc:
        discard(tmp)
        raise ServerUnreachable(server, str(exc)) from None
    except BaseException:
        discard(tmp)
        raise
    return final
