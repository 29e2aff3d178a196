"""MLflow's artifact routes (``/api/2.0/mlflow-artifacts/artifacts``): a run's files.

A run's artifact URI is ``mlflow-artifacts:/runs/<run id>``; the client resolves it against its
tracking URI, so every path here starts with ``runs/<run id>/``. The files live in the job's
directory, ``HOME/jobs/<id>/artifacts/`` (:attr:`JobLayout.artifacts`), which a launched job's
processes could reach: every path is walked from the server's home without following a link
(:mod:`trainhouse.jobfs.jobfiles`), a name is a plain component (no ``..``, ``.``, NUL or
backslash), a write goes to a fresh file renamed into place, a read opens only a regular file
with one link, and sizes are capped (``Settings.mlflow_artifact_bytes`` a file,
``mlflow_run_artifact_bytes`` a run). Not served: delete, multipart uploads, presigned URLs.
"""

from __future__ import annotations

import contextlib
import errno
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trainhouse.core.errors import MlflowError
from trainhouse.jobfs import jobfiles
from trainhouse.server.mlflow import access
from trainhouse.server.mlflow.protocol import invalid, missing
from trainhouse.store import Job
from trainhouse.usecases.runtime import Runtime

router = APIRouter()

ROOT = "/api/2.0/mlflow-artifacts/artifacts"
MAX_DEPTH = 32
MAX_PATH = 1024
MAX_COMPONENT = 255
MAX_LISTED = 10_000
CHUNK = 1 << 20


def split(path: str) -> tuple[int, list[str]]:
    """``runs/<id>/a/b`` as the run and the path below its root, every component checked."""
    if len(path) > MAX_PATH:
        raise invalid(f"artifact path is longer than {MAX_PATH} characters")
    parts = [p for p in path.strip("/").split("/")]
    if len(parts) < 2 or parts[0] != "runs":
        raise missing(f"no artifacts at {path[:200]!r}: paths are runs/<run id>/...")
    run = parts[1]
    if not (run.isascii() and run.isdigit() and len(run) <= 18):
        raise missing(f"Run with id={run[:40]!r} not found")
    rest = [p for p in parts[2:] if p != ""]
    if len(rest) > MAX_DEPTH:
        raise invalid(f"artifact path is deeper than {MAX_DEPTH} directories")
    for part in rest:
        if part in (".", "..") or "\x00" in part or "\\" in part or len(part) > MAX_COMPONENT:
            raise invalid(f"invalid artifact path component {part[:60]!r}")
        if part.startswith(".") and ".tmp-" in part:
            raise invalid(f"invalid artifact path component {part[:60]!r}")
    return int(run), rest


def _open_root(rt: Runtime, job: Job, *, make: bool) -> jobfiles.Dir:
    """The run's artifacts directory, walked from the home (made when ``make``)."""
    home = rt.settings.home
    files = rt.files(job.id)
    if not make:
        return jobfiles.open_dir(home, files.artifacts)
    (home / "jobs").mkdir(parents=True, exist_ok=True)
    d = jobfiles.open_dir(home, home / "jobs")
    for name in (str(job.id), "artifacts"):
        try:
            child = d.make_sub(name)
        finally:
            d.close()
        d = child
    return d


def _walk_to(root: jobfiles.Dir, parts: list[str], *, make: bool) -> jobfiles.Dir:
    d = root
    for name in parts:
        try:
            child = d.make_sub(name) if make else d.sub(name)
        finally:
            if d is not root:
                d.close()
        d = child
    return d


def _used(d: jobfiles.Dir, budget: list[int] | None = None, depth: int = MAX_DEPTH) -> int:
    """The bytes of the regular files below ``d`` (links, FIFOs and the rest are no artifacts
    and count nothing); past :data:`MAX_LISTED` entries the run is refused more."""
    budget = [MAX_LISTED] if budget is None else budget
    total = 0
    for name, st in d.entries(limit=MAX_LISTED):
        budget[0] -= 1
        if budget[0] < 0:
            raise invalid(f"a run holds at most {MAX_LISTED} artifact entries")
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode) and depth > 0:
            try:
                with d.sub(name) as child:
                    total += _used(child, budget, depth - 1)
            except OSError:
                continue
    return total


def _unsafe(exc: OSError) -> MlflowError:
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return missing("no such artifact")
    return invalid(f"artifact refused: {exc.strerror or exc}")


@router.put(ROOT + "/{path:path}")
async def upload(path: str, request: Request) -> JSONResponse:
    """Store one artifact (the request body), replacing one of the same path."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(path)
    if not parts:
        raise invalid("an artifact needs a file name below runs/<run id>/")
    job = await run_in_threadpool(access.run_job, rt, c, run, write=True)
    limit = rt.settings.mlflow_artifact_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise MlflowError(413, "INVALID_PARAMETER_VALUE", f"an artifact is at most {limit} bytes")

    def begin() -> tuple[jobfiles.Dir, jobfiles.Dir, str, BinaryIO]:
        root = _open_root(rt, job, make=True)
        try:
            used = _used(root)
            incoming = int(declared) if declared is not None and declared.isdigit() else 0
            if used + incoming > rt.settings.mlflow_run_artifact_bytes:
                raise MlflowError(
                    413,
                    "INVALID_PARAMETER_VALUE",
                    f"run {run}'s artifacts would pass {rt.settings.mlflow_run_artifact_bytes} "
                    f"bytes ({used} stored)",
                )
            d = _walk_to(root, parts[:-1], make=True)
            tmp, fh = d.create_temp(parts[-1])
        except BaseException:
            root.close()
            raise
        return root, d, tmp, fh

    try:
        root, d, tmp, fh = await run_in_threadpool(begin)
    except OSError as exc:
        raise _unsafe(exc) from None
    written = 0
    done = False
    try:
        async for chunk in request.stream():
            written += len(chunk)
            if written > limit:
                raise MlflowError(
                    413, "INVALID_PARAMETER_VALUE", f"an artifact is at most {limit} bytes"
                )
            if chunk:
                await run_in_threadpool(fh.write, chunk)
        await run_in_threadpool(fh.close)
        try:
            await run_in_threadpool(d.rename, tmp, parts[-1])
        except IsADirectoryError:
            raise invalid(f"{'/'.join(parts)} is a directory of artifacts") from None
        done = True
    finally:
        fh.close()
        if not done:
            with contextlib.suppress(OSError):
                d.unlink(tmp)
        if d is not root:
            d.close()
        root.close()
    return JSONResponse({})


@router.get(ROOT + "/{path:path}")
async def download(path: str, request: Request) -> StreamingResponse:
    """One artifact's bytes."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(path)
    if not parts:
        raise missing("no artifact at the run's root: name a file")
    job = await run_in_threadpool(access.run_job, rt, c, run, write=False)

    def open_it() -> BinaryIO:
        root = _open_root(rt, job, make=False)
        try:
            d = _walk_to(root, parts[:-1], make=False)
            try:
                return d.open_file(parts[-1], max_size=rt.settings.mlflow_artifact_bytes)
            finally:
                if d is not root:
                    d.close()
        finally:
            root.close()

    try:
        fh = await run_in_threadpool(open_it)
    except OSError as exc:
        raise _unsafe(exc) from None

    def chunks() -> Iterator[bytes]:
        with fh:
            while data := fh.read(CHUNK):
                yield data

    return StreamingResponse(chunks(), media_type="application/octet-stream")


@router.get(ROOT)
async def list_artifacts(request: Request) -> JSONResponse:
    """The entries of one directory of a run's artifacts (``path``: ``runs/<id>/...``), names
    relative to it; a file's path lists the file itself; a missing one lists nothing."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(request.query_params.get("path", ""))
    job = await run_in_threadpool(access.run_job, rt, c, run, write=False)

    def listing() -> list[dict[str, Any]]:
        try:
            root = _open_root(rt, job, make=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            try:
                d = _walk_to(root, parts, make=False)
            except NotADirectoryError:  # a file: itself
                d = _walk_to(root, parts[:-1], make=False)
                try:
                    st = d.lstat(parts[-1])
                finally:
                    if d is not root:
                        d.close()
                if st is None or not stat.S_ISREG(st.st_mode):
                    return []
                return [{"path": parts[-1], "is_dir": False, "file_size": st.st_size}]
            except FileNotFoundError:
                return []
            try:
                found = d.entries(limit=MAX_LISTED)
            finally:
                if d is not root:
                    d.close()
        finally:
            root.close()
        out: list[dict[str, Any]] = []
        for name, st in found:
            if name.startswith(".") and ".tmp-" in name:
                continue  # an upload under way
            if stat.S_ISDIR(st.st_mode):
                out.append({"path": name, "is_dir": True})
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                out.append({"path": name, "is_dir": False, "file_size": st.st_size})
        return out

    try:
        files = await run_in_threadpool(listing)
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            raise invalid(str(exc)) from None
        raise _unsafe(exc) from None
    return JSONResponse({"files": files})
