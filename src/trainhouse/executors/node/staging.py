"""Staging a job's pinned dataset versions on one node, run by the attempt's supervisor before
torchrun starts (``TRAINHOUSE_DATASETS``, :class:`~trainhouse.core.datasets.StageRequest`).

For each version: its manifest comes from the server with the attempt's credential (which reads
only the versions its job pins) and is checked against the pinned digest; its files go into the
node's cache (:mod:`trainhouse.jobfs.datacache`: once per node per file, verified as written,
read-only), fetched from where the version lives: the URL with its storage options (the node's
own credentials, the way the protocol's library reads them), or the server's dataset storage
over REST. Each rank then gets ``TRAINHOUSE_DATASET_<KEY>``, the path of the version's
read-only tree; no rank starts before every version is complete.

The launcher's log says what happens (``trainhouse: staging digits@2: 41% (120 of 290 MB)``); a
failure ends the attempt with its reason naming the file and the cause.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trainhouse.core.datasets import (
    STAGING_LINE,
    FileEntry,
    Manifest,
    StagedSource,
    StageRequest,
    env_var,
)
from trainhouse.core.errors import ClientError, ServerUnreachable, StagingError
from trainhouse.core.flows import input_var
from trainhouse.jobfs import datasources
from trainhouse.jobfs.datacache import DataCache, Staged
from trainhouse.jobfs.layout import JOB_ID_ENV, JOB_TOKEN_ENV, URL_ENV

__all__ = ["stage"]

PROGRESS_EVERY = 2.0  # seconds between two progress lines of one version
TIMEOUT = 60.0


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


class _Server:
    """The server's datasets API with the attempt's credential."""

    def __init__(self, environ: dict[str, str]) -> None:
        import httpx

        self.url = environ.get(URL_ENV, "")
        self.job_id = environ.get(JOB_ID_ENV, "")
        token = environ.get(JOB_TOKEN_ENV, "")
        self.http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "X-Trainhouse-Request": "1"},
            timeout=TIMEOUT,
        )

    def _path(self, source: StagedSource) -> str:
        pin = source.pin
        if source.kind == "model":  # an input: the job's own route, its pins only
            return f"/api/v1/jobs/{quote(self.job_id)}/inputs/{quote(pin.key)}"
        return f"/api/v1/datasets/{quote(pin.name)}/versions/{pin.version}"

    def manifest(self, source: StagedSource) -> Manifest:
        import httpx

        from trainhouse.core.wire import send

        try:
            resp = send(self.http, self.url, "GET", self._path(source) + "/manifest")
        except ServerUnreachable as exc:
            raise StagingError(f"the server did not answer: {exc}", transient=True) from None
        except ClientError as exc:
            raise StagingError(
                f"{source.pin.ref}: the server refused its manifest ({exc})",
                transient=exc.status >= 500,
            ) from None
        except httpx.HTTPError as exc:
            raise StagingError(f"{source.pin.ref}: {exc}", transient=True) from None
        return Manifest.from_json(resp.json()["files"])

    @contextlib.contextmanager
    def open(self, source: StagedSource, entry: FileEntry) -> Iterator[_Chunks]:
        import httpx

        path = self._path(source) + "/files/" + quote(entry.path)
        try:
            with self.http.stream("GET", path) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise StagingError(
                        f"{entry.path}: the server answered HTTP {resp.status_code}",
                        transient=resp.status_code >= 500,
                    )
                yield _Chunks(resp.iter_bytes(1 << 20))
        except httpx.TransportError as exc:
            raise StagingError(
                f"{entry.path}: {type(exc).__name__}: {exc}", transient=True
            ) from None

    def close(self) -> None:
        self.http.close()


class _Chunks:
    """A readable stream over an iterator of chunks (what the cache's writer reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._chunks)
            except StopIteration:
                break
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out


def _progress(ref: str, say: Callable[[str], None]) -> Callable[[int, int], None]:
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < PROGRESS_EVERY and done < total:
            return
        last[0] = now
        percent = 100 * done // total if total else 100
        say(f"{STAGING_LINE} {ref}: {percent}% ({_mb(done)} of {_mb(total)})")

    return report


def _fetcher(server: _Server, source: StagedSource) -> Callable[[FileEntry], Any]:
    """How one version's files are read: from its URL, or from the server."""
    url, options = source.url, dict(source.storage_options)
    if url is None:
        return lambda entry: server.open(source, entry)
    return lambda entry: datasources.open_file(url, options, entry.path, entry.size)


def stage(
    request: StageRequest, environ: dict[str, str], say: Callable[[str], None]
) -> tuple[dict[str, str], list[Staged]]:
    """Stage every version of ``request``; the ranks' variables and what holds each version
    in use until the attempt ends (release them then). Raises StagingError."""
    cache = DataCache(Path(request.cache), request.cache_bytes)
    server = _Server(environ)
    variables: dict[str, str] = {}
    held: list[Staged] = []
    try:
        for source in request.sources:
            pin = source.pin
            manifest = server.manifest(source)
            if manifest.digest != pin.digest:
                raise StagingError(
                    f"{pin.ref}: the server's manifest is not the one the job pinned "
                    f"({manifest.digest[:12]} != {pin.digest[:12]})"
                )
            fetch = _fetcher(server, source)
            started = time.monotonic()
            say(f"{STAGING_LINE} {pin.ref}: {len(manifest.files)} files, {_mb(manifest.size)}")
            staged = cache.stage(manifest, fetch, progress=_progress(pin.ref, say), out=say)
            held.append(staged)
            name = input_var(pin.key) if source.kind == "model" else env_var(pin.key)
            variables[name] = str(staged.path)
            say(
                f"{STAGING_LINE} {pin.ref}: ready in {time.monotonic() - started:.2f} s "
                f"({_mb(staged.fetched_bytes)} fetched, {staged.reused} files cached) "
                f"at {staged.path}"
            )
    except BaseException:
        for staged in held:
            staged.release()
        raise
    finally:
        server.close()
    return variables, held
