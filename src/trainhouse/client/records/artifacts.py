"""A job's artifacts as the client returns them."""

from typing import TypedDict

__all__ = ["Artifact", "ArtifactList"]


class Artifact(TypedDict):
    """``ArtifactOut``: one artifact file of a job."""

    path: str
    size: int
    mtime: float
    kind: str  # "text", "table", "image" or "file" (by its name)


class ArtifactList(TypedDict):
    """``ArtifactListOut``: a job's artifacts."""

    job_id: int
    artifacts: list[Artifact]
    total_bytes: int
    skipped: int
    truncated: bool
