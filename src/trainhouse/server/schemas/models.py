"""The bodies of the model registry's routes: registering a version (a job's saved model, or
a checkpoint with a loader), aliases, a version, a model and the list. The saved model's own
record and the pieces the API shows of it live in :mod:`trainhouse.core.modelrecord`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainhouse.core.modelrecord import ModelFileOut, ModelName, TensorSpec
from trainhouse.server.schemas.common import INT32, INT64, NO_NUL
from trainhouse.server.schemas.jobs import PromotionOut


class ModelRegisterIn(BaseModel):
    """What the SDK registers: the directory it saved (relative to the job's checkpoints)."""

    name: ModelName
    path: str = Field(min_length=1, max_length=1024, pattern=NO_NUL)


class VersionFromJobIn(BaseModel):
    """``trainhouse models register NAME --job J [--step S]``: a job's saved model; with
    ``loader`` (``--loader FILE.py:FUNCTION``), one of its checkpoints (the newest, or the one
    of ``step``) rebuilt by that function of the job's code, whose ``inputs`` a server
    without torch cannot know (optional: serving and exports need them)."""

    job: int = Field(ge=0, le=INT64)
    step: int | None = Field(None, ge=0, le=INT64)
    loader: str | None = Field(
        None, min_length=1, max_length=320, description="file.py:function in the job's workdir"
    )
    inputs: list[TensorSpec] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="the model's inputs (with loader only): shape [null, ...], null the batch",
    )


class AliasIn(BaseModel):
    version: int = Field(ge=1, le=INT32)


class OwnerIn(BaseModel):
    # a user's name, as ``admin user add`` takes it
    owner: str = Field(min_length=1, max_length=64, pattern=r"^[a-z_][a-z0-9_.-]{0,63}$")


class ModelVersionOut(BaseModel):
    model: str
    version: int
    job_id: int | None
    attempt: int
    step: int
    kind: str
    files: list[ModelFileOut]
    size: int
    metrics: dict[str, float | None]
    signature: dict[str, Any]
    record: dict[str, Any]
    created_at: float
    aliases: list[str]


class ModelOut(BaseModel):
    name: str
    owner: str
    created_at: float
    versions: int
    latest: int | None
    aliases: dict[str, int]


class ModelListOut(BaseModel):
    models: list[ModelOut]


class PromotionRecordOut(PromotionOut):
    """A decision a job's ``promote:`` made about one of the model's versions."""

    job_id: int


class ModelDetailOut(BaseModel):
    model: ModelOut
    versions: list[ModelVersionOut]
    promotions: list[PromotionRecordOut] = Field(
        default_factory=list, description="What jobs' promote: decided, newest first"
    )
    readers: dict[str, list[int]] = Field(
        default_factory=dict,
        description="version -> the jobs that read it as an input (inputs:), newest first",
    )
