"""A job's artifacts: ``GET /jobs/{id}/artifacts`` (the listing) and
``GET /jobs/{id}/artifacts/content?path=...`` (one file). The work is
:mod:`trainhouse.usecases.artifacts`'s; these routes parse, call and render.

Every file is job-written, so what is sent is never active content: a download is
``application/octet-stream`` with ``Content-Disposition: attachment``; an inline view
(``inline=true``, for the job page) is ``text/plain`` or a raster image type sniffed from the
bytes, and either carries ``X-Content-Type-Options: nosniff`` and a CSP that allows nothing
(``default-src 'none'; sandbox``), so not even a file opened on its own runs a script.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from trainhouse.core.records import Job
from trainhouse.server.auth import readable_job
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import NO_NUL, ArtifactListOut, ArtifactOut
from trainhouse.usecases import artifacts
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["jobs"])

#: what a job-written file may do when a browser opens it: nothing
CSP = "default-src 'none'; sandbox"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def disposition(kind: str, name: str) -> str:
    """``attachment`` (or ``inline``) with the file's name: an ASCII fallback and the UTF-8
    name percent-encoded (RFC 6266), neither able to break the header."""
    ascii_name = _UNSAFE_NAME.sub("_", name).strip("._") or "artifact"
    return f"{kind}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


@router.get("/jobs/{job_id}/artifacts", response_model=ArtifactListOut)
def list_artifacts(
    job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)
) -> ArtifactListOut:
    """The job's artifacts (``run.log_artifact``, MLflow's ``log_artifact``), sorted by path,
    with their sizes; links, FIFOs, sockets, devices and hard-linked files are left out (and
    counted in ``skipped``)."""
    found, skipped, truncated = artifacts.listing(rt, job)
    return ArtifactListOut(
        job_id=job.id,
        artifacts=[
            ArtifactOut(path=a.path, size=a.size, mtime=a.mtime, kind=a.kind) for a in found
        ],
        total_bytes=sum(a.size for a in found),
        skipped=skipped,
        truncated=truncated,
    )


@router.get("/jobs/{job_id}/artifacts/content")
def artifact_content(
    job: Job = Depends(readable_job),
    path: str = Query(
        ..., min_length=1, max_length=1024, pattern=NO_NUL, description="The artifact's path"
    ),
    inline: bool = Query(
        False,
        description="Show it rather than download it: only text or a PNG, JPEG, GIF or WebP "
        f"image of at most {artifacts.MAX_INLINE} bytes",
    ),
    rt: Runtime = Depends(runtime),
) -> StreamingResponse:
    """One artifact's bytes: a download (``attachment``), or with ``inline=true`` a small text
    file or raster image to show (422 or 413 for anything else)."""
    opened = artifacts.open_artifact(rt, job, path, inline=inline)
    headers = {
        "Content-Disposition": disposition("inline" if inline else "attachment", opened.name),
        "Content-Length": str(opened.size),
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": CSP,
        "Cache-Control": "private, no-cache",
    }
    return StreamingResponse(opened.chunks, media_type=opened.content_type, headers=headers)
