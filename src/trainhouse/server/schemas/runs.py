"""The bodies of the runs table's routes: tags, notes, archiving, deleting a job, the
hparams a run reported, and the columns a table can show."""

from __future__ import annotations

from typing import Annotated, Any

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
