"""The bodies of the runs table's routes: tags, notes, archiving, deleting a job, the
hparams a run reported, and the columns a table can show."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from trainhouse.server.schemas.common import NO_NUL


class TagsIn(BaseModel):
    add: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=32)
    remove: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=32)


class TagsOut(BaseModel):
    job_id: int
    tags: list[str]


class NoteIn(BaseModel):
    note: str = Field(max_length=65536, pattern=NO_NUL, description="Markdown; empty clears it")


class ProjectIn(BaseModel):
    project: str = Field(
        min_length=1, max_length=128, description="The project the job moves to (as a spec's)"
    )


class ArchiveIn(BaseModel):
    archived: bool = True


class DeletedOut(BaseModel):
    job_id: int
    rows: dict[str, int] = Field(description="Rows deleted, by table")
    bytes_freed: int = Field(description="Bytes of the job's files (logs, checkpoints) removed")


class HparamsIn(BaseModel):
    hparams: dict[str, Any] = Field(
        description="Every hparam the run uses now (the script's defaults and the spec's)"
    )
    script_keys: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None,
        max_length=10000,
        description="The keys the script declared (its defaults); spec keys outside them are "
        "flagged as never read. Null: not known (nothing is flagged)",
    )


class HparamsOut(BaseModel):
    job_id: int
    unread: list[str] = Field(description="Spec hparams the script does not declare")
    warnings: list[str]


class RunColumnsOut(BaseModel):
    hparams: list[str]
    metrics: list[str]
    projects: list[str]
    tags: list[str]


class RunNumbersOut(BaseModel):
    job_id: int
    final: float | None = Field(description="The value at the last step (null: not finite)")
    final_step: int
    best: float | None = Field(description="min or max, as the metric's goal says; null: no goal")
    min: float | None = Field(description="The smallest finite value")
    max: float | None = Field(description="The largest finite value")
    last_mean: float | None = Field(description="The mean of the finite values of the last points")
    last_count: int = Field(description="How many values last_mean is of")


class MetricNumbersOut(BaseModel):
    name: str
    goal: Literal["min", "max"] | None = Field(
        description="Lower or higher is better; null: unknown"
    )
    goal_from: str | None = Field(
        description="Where the goal comes from: a search's metric, a job's checkpoints.metric, "
        "or the metric's name"
    )
    runs: list[RunNumbersOut] = Field(description="The jobs that logged it, in the order asked")


class CompareOut(BaseModel):
    job_ids: list[int]
    last: int = Field(description="The points last_mean is of (at most)")
    metrics: list[MetricNumbersOut]
