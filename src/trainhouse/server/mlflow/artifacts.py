"""MLflow's artifact routes (``/api/2.0/mlflow-artifacts/artifacts``): a run's files.

A run's artifact URI is ``mlflow-artifacts:/runs/<run id>``; the client resolves it against its
tracking URI, so every path here starts with ``runs/<run id>/``. A name is a plain component
(no ``..``, ``.``, NUL or backslash, no name of an upload under way), checked here; where the
files live and how they are written and read safely is
:mod:`trainhouse.usecases.tracking.artifacts`. Not served: delete, multipart uploads, presigned
URLs. An image ``log_image(key=, step=)`` uploads (``images/<key>+step+<n>+...png``) is checked
as the SDK's images are and stored as the job's media too.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trainhouse.core.errors import InvalidMedia
from trainhouse.core.media import MAX_IMAGE_BYTES, mlflow_image, prepare_image
from trainhouse.server.mlflow import access
from trainhouse.server.mlflow.protocol import invalid, missing
from trainhouse.usecases import media
from trainhouse.usecases.runtime import Runtime
from trainhouse.usecases.tracking import artifacts
from trainhouse.usecases.tracking.artifacts import MAX_DEPTH

router = APIRouter()

ROOT = "/api/2.0/mlflow-artifacts/artifacts"
MAX_PATH = 1024
MAX_COMPONENT = 255


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


@router.put(ROOT + "/{path:path}")
async def upload(path: str, request: Request) -> JSONResponse:
    """Store one artifact (the request body), replacing one of the same path."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(path)
    if not parts:
        raise invalid("an artifact needs a file name below runs/<run id>/")
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    image = mlflow_image(parts)  # log_image(key=, step=): the job's media too
    kept = bytearray() if image is not None else None
    started = await run_in_threadpool(artifacts.upload, rt, c, run, parts, declared)
    try:
        async for chunk in request.stream():
            if chunk:
                if kept is not None:
                    kept += chunk[: MAX_IMAGE_BYTES + 1 - len(kept)]
                await run_in_threadpool(started.write, chunk)
        item = None
        if image is not None and kept is not None:
            try:
                item = prepare_image(image[0], image[1], bytes(kept))
            except InvalidMedia as exc:  # refused before the artifact is in place
                raise invalid(f"image {image[0]!r} at step {image[1]}: {exc}") from None
        await run_in_threadpool(started.finish)
    finally:
        started.close()
    if item is not None:
        try:
            await run_in_threadpool(media.store_for_run, rt, c, run, item)
        except InvalidMedia as exc:
            raise invalid(f"image {item.key!r} at step {item.step} not shown: {exc}") from None
    return JSONResponse({})


@router.get(ROOT + "/{path:path}")
async def download(path: str, request: Request) -> StreamingResponse:
    """One artifact's bytes."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(path)
    if not parts:
        raise missing("no artifact at the run's root: name a file")
    chunks = await run_in_threadpool(artifacts.download, rt, c, run, parts)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.get(ROOT)
async def list_artifacts(request: Request) -> JSONResponse:
    """The entries of one directory of a run's artifacts (``path``: ``runs/<id>/...``), names
    relative to it; a file's path lists the file itself; a missing one lists nothing."""
    rt: Runtime = request.app.state.runtime
    c = await run_in_threadpool(access.caller, request, rt)
    run, parts = split(request.query_params.get("path", ""))
    found = await run_in_threadpool(artifacts.listing, rt, c, run, parts)
    files = [
        {"path": e.path, "is_dir": True}
        if e.is_dir
        else {"path": e.path, "is_dir": False, "file_size": e.file_size}
        for e in found
    ]
    return JSONResponse({"files": files})
