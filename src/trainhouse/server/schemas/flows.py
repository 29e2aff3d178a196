"""The bodies of the flows routes: a flow's steps as submitted, a flow with its steps' jobs,
the list."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from trainhouse.core.flows import MAX_INPUTS, MAX_STEPS
from trainhouse.core.lifecycle import JobState
from trainhouse.server.schemas.common import NO_NUL

StepName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")]
InputKey = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]


class StepIn(BaseModel):
    """One step: its upstream steps, the inputs that are upstream steps' models, and which of
    the uploaded archives (``workdir`` parts, in order) is its workdir. Its spec is the
    ``spec`` part of the same index."""

    model_config = {"extra": "forbid"}

    name: StepName
    after: list[StepName] = Field(default_factory=list, max_length=MAX_STEPS)
    inputs: dict[InputKey, StepName] = Field(default_factory=dict, max_length=MAX_INPUTS)
    archive: int = Field(0, ge=0, lt=MAX_STEPS)


class FlowIn(BaseModel):
    """``POST /flows``'s ``flow`` part."""

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=128, pattern=NO_NUL)
    steps: list[StepIn] = Field(min_length=1, max_length=MAX_STEPS)


class FlowStepOut(BaseModel):
    name: str
    job_id: int
    after: list[str]
    inputs: dict[str, str] = Field(description="key -> the upstream step whose model it reads")
    state: JobState | None = Field(description="null: the step's job was deleted")
    reason: str | None = None
    job_name: str | None = None
    last_step: int | None = None
    total_steps: int | None = None


class FlowOut(BaseModel):
    id: int
    name: str
    owner: str
    created_at: float
    state: Literal["QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELED"]
    jobs: dict[str, int] = Field(description="step -> job id")
    steps: list[FlowStepOut] = Field(description="Upstreams first")


class FlowListOut(BaseModel):
    flows: list[FlowOut]
    total: int
