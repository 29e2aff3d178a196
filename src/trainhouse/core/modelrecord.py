"""The record a saved model carries (``model.json``, written by a job: hostile input, every
field checked) and the pieces the REST API shows of it: its signature and its files."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from trainhouse.core.reports import INT32, INT64

#: Text that reaches the database (a name, an owner, a filter): PostgreSQL stores no NUL
#: character and refuses a query that holds one, so a request with one is refused up front.
NO_NUL = r"^[^\x00]*$"

ModelName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class TensorSpec(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=NO_NUL)
    shape: list[Annotated[int, Field(ge=0, le=INT32)] | None] = Field(max_length=16)
    dtype: str = Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_]+$")


class SignatureOut(BaseModel):
    inputs: list[TensorSpec] = Field(max_length=64)
    outputs: list[TensorSpec] = Field(max_length=64)


class ModelFileOut(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    size: int = Field(ge=0, le=INT64)
    sha256: Digest


class CheckpointSource(BaseModel):
    """Where a "checkpoint" model's file came from: the job's checkpoint, as registered."""

    id: int = Field(ge=0, le=INT64)
    path: str = Field(min_length=1, max_length=1024, pattern=NO_NUL)
    algorithm: str = Field(min_length=1, max_length=16, pattern=r"^[a-z0-9]+$")
    digest: str = Field(min_length=1, max_length=128, pattern=r"^[0-9a-f]+$")


class SavedModelRecord(BaseModel):
    """``model.json`` as a job wrote it (hostile input: every field checked); the server
    writes the record of a "checkpoint" model itself."""

    name: ModelName
    kind: Literal["export", "loader", "checkpoint"]
    loader: str | None = Field(None, max_length=320)
    signature: SignatureOut
    torch: str | None = Field(None, max_length=64, pattern=NO_NUL)  # None: "checkpoint"
    job_id: int | None = Field(None, ge=0, le=INT64)
    attempt: int = Field(ge=0, le=INT32)  # 0: a checkpoint a clone was given
    step: int = Field(ge=0, le=INT64)
    code_digest: Digest | None = None
    metrics: dict[Annotated[str, Field(max_length=256, pattern=NO_NUL)], float | None] = Field(
        default_factory=dict, max_length=1000
    )
    files: list[ModelFileOut] = Field(min_length=1, max_length=8)
    created_at: float | None = None
    checkpoint: CheckpointSource | None = None
