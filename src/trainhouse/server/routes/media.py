"""Media a job logs: images, histograms and tables at a step. The SDK stores one item per
request with the job's credential; the dashboard lists a job's items and reads each. The work
is :mod:`trainhouse.usecases.media`'s; these routes parse, call and render.

An image is served as the PNG that was checked when it was stored (``image/png``, ``nosniff``,
a sandboxing Content-Security-Policy): never as anything a browser would run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from trainhouse.core.errors import NotFound
from trainhouse.core.media import HISTOGRAM_BUCKETS
from trainhouse.core.records import Job
from trainhouse.server.auth import readable_job, reporting_job
from trainhouse.server.deps import runtime
from trainhouse.server.schemas import RowId
from trainhouse.usecases import media
from trainhouse.usecases.reports import in_thread
from trainhouse.usecases.runtime import Runtime

router = APIRouter(tags=["media"])

IMAGE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private, max-age=3600",
    "Content-Disposition": "inline",
}


class MediaIn(BaseModel):
    """One item (the body is parsed by :func:`trainhouse.core.media.parse_item`)."""

    kind: Literal["image", "histogram", "table"]
    key: str = Field(min_length=1, max_length=256)
    step: int = Field(ge=0)
    caption: str | None = None
    png: str | None = Field(None, description="image: the PNG file, base64")
    values: str | None = Field(
        None,
        description=f"histogram: the raw values as little-endian float32, base64 (bucketed "
        f"into {HISTOGRAM_BUCKETS} buckets by the server)",
    )
    columns: list[str] | None = Field(None, description="table: the column names")
    rows: list[list[Any]] | None = Field(None, description="table: the rows, one cell a column")


class MediaItemOut(BaseModel):
    id: int
    job_id: int
    key: str
    step: int
    kind: str
    width: int | None
    height: int | None
    caption: str | None
    size: int = Field(description="bytes stored")
    created_at: float


class MediaListOut(BaseModel):
    job_id: int
    items: list[MediaItemOut]


class MediaOut(MediaItemOut):
    data: dict[str, Any] | None = Field(
        description="a histogram ({min, max, count, buckets, nan, inf, neginf}) or a table "
        "({columns, rows}); null for an image (GET .../image)"
    )


_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": MediaIn.model_json_schema()}},
    }
}


async def _raw_body(request: Request) -> bytes:
    return await request.body()


@router.post(
    "/jobs/{job_id}/media", response_model=MediaItemOut, status_code=201, openapi_extra=_BODY
)
async def log_media(
    body: bytes = Depends(_raw_body),
    job: Job = Depends(reporting_job),
    rt: Runtime = Depends(runtime),
) -> MediaItemOut:
    """One image, histogram or table of the job at a step (the job's credential); the same
    key and step again replaces it. Refused (422, naming the rule) past the bounds of an item
    or of the job's media, or for a PNG that is not one."""
    item = await in_thread(media.log, rt, job, body)
    return MediaItemOut(**asdict(item))


@router.get("/jobs/{job_id}/media", response_model=MediaListOut)
def list_media(job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)) -> MediaListOut:
    """The job's items, by key then step, without their data."""
    return MediaListOut(
        job_id=job.id, items=[MediaItemOut(**asdict(i)) for i in media.items(rt, job)]
    )


@router.get("/jobs/{job_id}/media/{item_id}", response_model=MediaOut)
def get_media(
    item_id: RowId, job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)
) -> MediaOut:
    """One item: a histogram's buckets or a table's rows; an image's PNG is ``.../image``."""
    item, data = media.get(rt, job, item_id)
    value = None if item.kind == "image" else orjson.loads(data)
    return MediaOut(**asdict(item), data=value)


@router.get(
    "/jobs/{job_id}/media/{item_id}/image",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
def get_image(
    item_id: RowId, job: Job = Depends(readable_job), rt: Runtime = Depends(runtime)
) -> Response:
    """An image's PNG, as checked when it was stored."""
    item, data = media.get(rt, job, item_id)
    if item.kind != "image":
        raise NotFound(f"media item {item_id} of job {job.id} is a {item.kind}, not an image")
    return Response(data, media_type="image/png", headers=IMAGE_HEADERS)
