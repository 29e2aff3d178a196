"""The bodies of the metric routes: a job's series (with or without their points) and the
SDK's report, the wire format of a flush of metric points."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from trainhouse.server.schemas.common import INT32, INT64, NO_NUL


class SeriesOut(BaseModel):
    name: str
    rank: int | None
    points: list[tuple[int, float | None, float]] = Field(
        description="[step, value, wall_time] by step; value is null where it was NaN or infinite"
    )
    total_points: int = Field(0, description="The series' points (past after_step)")
    downsampled: bool = Field(
        False,
        description="points is a subset of at most max_points: the first and the last point, "
        "and per step bucket the smallest and the largest value",
    )


class MetricsOut(BaseModel):
    job_id: int
    series: list[SeriesOut]


class SeriesInfoOut(BaseModel):
    name: str
    rank: int | None = Field(description="null: the job's own values; a rank's (all_ranks=True)")
    points: int = Field(description="How many points the series has")
    last_step: int


class SeriesListOut(BaseModel):
    job_id: int
    series: list[SeriesInfoOut]


Step = Annotated[int, Field(ge=0, le=INT64)]
MetricName = Annotated[str, Field(min_length=1, max_length=256)]
Rank = Annotated[int, Field(ge=0, le=1_000_000)]
MetricTuple = tuple[Step, MetricName, float | None, Rank | None, float]


class ReportIn(BaseModel):
    """One flush of the SDK's buffer: metric points plus a heartbeat.

    The wire format, published here; the route checks it by hand, column by column
    (``trainhouse.core.reports.parse_report``), with the same rules."""

    batch_id: str = Field(min_length=1, max_length=64, pattern=NO_NUL)
    attempt: int = Field(ge=1, le=INT32)
    points: list[MetricTuple] = Field(
        default_factory=list,
        max_length=200_000,
        description="[step, name, value, rank, wall_time]; rank null = the job's own value",
    )
    columns: dict[str, list[Any]] | None = Field(
        None,
        description="The same points as five lists of one length (what the SDK sends, faster "
        "to parse): {step: [...], name: [...], value: [...], rank: [...], wall_time: [...]}; "
        "when given, points is ignored",
    )
    total_steps: int | None = Field(None, ge=0, le=INT64)
    resume_step: int | None = Field(
        None,
        ge=-1,
        le=INT64,
        description="The attempt resumed after this step (-1: from scratch); points of earlier "
        "attempts past it are dropped, so each step is stored once, from the final lineage",
    )


class ReportOut(BaseModel):
    accepted: int
    stop: bool
    stop_reason: str | None = None
