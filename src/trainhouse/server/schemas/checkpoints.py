"""The bodies of the checkpoint routes: a checkpoint, a job's list, a checkpoint's files,
and what the SDK registers (or reports corrupt)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from trainhouse.server.schemas.common import INT32, INT64, NO_NUL
from trainhouse.server.schemas.metrics import ReportOut


class CheckpointOut(BaseModel):
    id: int
    job_id: int
    attempt: int
    step: int
    path: str
    size: int
    sha256: str
    metrics: dict[str, float | None]
    created_at: float
    deleted: bool
    kind: str = Field("file", description='"file" (torch.save) or "sharded" (a DCP directory)')
    corrupt: str | None = Field(None, description="Why a load refused it; null when fine")
    algorithm: str = Field(
        "sha256", description='What the digest in "sha256" was made with: "sha256" or "blake3"'
    )


class CheckpointRegisteredOut(CheckpointOut):
    """What registering a checkpoint answers (``POST /jobs/{id}/checkpoints``, the SDK's)."""

    report: ReportOut | None = Field(
        None, description="The answer to the report the registration carried; null without one"
    )


class CheckpointListOut(BaseModel):
    job_id: int
    directory: str | None = Field(
        None, description="Where the job's checkpoints are; null unless the caller is an admin"
    )
    checkpoints: list[CheckpointOut]


class CheckpointFileOut(BaseModel):
    name: str = Field(description='Relative to a sharded checkpoint; "" for a file checkpoint')
    size: int


class CheckpointFilesOut(BaseModel):
    checkpoint: CheckpointOut
    files: list[CheckpointFileOut]


class CheckpointIn(BaseModel):
    attempt: int = Field(ge=1, le=INT32)
    step: int = Field(ge=0, le=INT64)
    path: str = Field(min_length=1, max_length=1024, pattern=NO_NUL)
    size: int = Field(ge=0, le=INT64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    metrics: dict[str, float | None] = Field(default_factory=dict)
    kind: Literal["file", "sharded"] = "file"
    algorithm: Literal["sha256", "blake3"] = Field(
        "sha256", description='What the digest in "sha256" was made with'
    )
    report: dict[str, Any] | None = Field(
        None,
        description="The metric points logged before the checkpoint (a ReportIn, at most "
        "the route's 1 MiB body): stored before it is registered, in one request",
    )


class CorruptIn(BaseModel):
    reason: str = Field(min_length=1, max_length=2000, pattern=NO_NUL)
