"""The bodies of the artifact routes: a job's artifacts as listed."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ArtifactOut(BaseModel):
    path: str = Field(description="Relative to the job's artifacts, '/' between directories")
    size: int
    mtime: float = Field(description="When it was written (seconds since the epoch)")
    kind: str = Field(
        description='What its name suggests: "text", "table", "image" or "file" (the inline '
        "view decides by the bytes)"
    )


class ArtifactListOut(BaseModel):
    job_id: int
    artifacts: list[ArtifactOut]
    total_bytes: int
    skipped: int = Field(
        0, description="Entries left out: links, FIFOs, sockets, devices, hard-linked files"
    )
    truncated: bool = Field(False, description="The listing stopped at its bound")
