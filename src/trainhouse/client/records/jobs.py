"""Records of jobs, their attempts, the runs table, metrics and checkpoints.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import Any, TypedDict

from trainhouse.client.records.datasets import DatasetPin

__all__ = [
    "Attempt",
    "Checkpoint",
    "CheckpointFile",
    "CheckpointFiles",
    "CheckpointList",
    "Clone",
    "Deleted",
    "DryRun",
    "Event",
    "InputRead",
    "Job",
    "JobDetail",
    "JobMetrics",
    "JobPage",
    "LogRanks",
    "MetricSeries",
    "Promotion",
    "RunColumns",
    "SeriesInfo",
    "SeriesList",
    "Tags",
    "Upstream",
]


# -- jobs ------------------------------------------------------------------------------------
class Attempt(TypedDict):
    """``AttemptOut``: one attempt of a job (``JobDetail.attempt_history``)."""

    number: int
    started_at: float
    ended_at: float | None
    result: str | None  # an AttemptResult
    exit_code: int | None
    rank_exit_codes: dict[str, int] | None
    placement: dict[str, Any] | None
    pid: int | None
    reason: str | None
    failure: str | None  # a FailureKind: "user" or "infra"
    failed_rank: int | None
    log_tail: str | None


class Event(TypedDict):
    """``EventOut``: a state change of a job."""

    at: float
    from_state: str | None
    to_state: str
    reason: str | None


class Job(TypedDict):
    """``JobOut``: a job as lists and most writes return it."""

    id: int
    name: str
    owner: str
    state: str  # a JobState
    priority: str
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    restarts: int
    infra_restarts: int
    exit_code: int | None
    reason: str | None
    cancel_requested: bool
    preempt_requested: bool
    placement: dict[str, Any] | None
    total_steps: int | None
    last_step: int | None
    latest_metrics: dict[str, float | None]
    spec: dict[str, Any]
    archive_sha256: str
    kind: str
    search_id: int | None
    prune_requested: bool
    resize_requested: bool
    resumes: int
    cloned_from: int | None
    cloned_step: int | None
    held: bool
    project: str
    tags: list[str]
    note: str | None
    archived: bool
    flow_id: int | None
    flow_step: str | None
    hparams: dict[str, Any] | None
    values: dict[str, float | str | None]


class Clone(TypedDict):
    """``CloneOut``: a job cloned from another (``JobDetail.clones``)."""

    id: int
    name: str
    state: str
    cloned_step: int | None


class Upstream(TypedDict):
    """``UpstreamOut``: a job another waits for (``JobDetail.after``)."""

    job_id: int
    when: str  # "completed" | "ended"
    state: str | None  # None: deleted, or not the caller's to read


class InputRead(TypedDict):
    """``InputOut``: the model version a job read under one of its inputs."""

    key: str
    ref: str
    model: str
    version: int
    attempt: int


class Promotion(TypedDict):
    """``PromotionOut``: a job's promote: and what was decided when it completed."""

    alias: str
    metric: str
    mode: str
    model: str | None
    version: int | None
    value: float | None
    previous_version: int | None
    previous_value: float | None
    promoted: bool | None
    decision: str | None
    decided_at: float | None


class JobDetail(Job):
    """``JobDetailOut``: ``GET /jobs/{id}``, a job with its history."""

    attempt_history: list[Attempt]
    events: list[Event]
    checkpoints: int
    clones: list[Clone]
    log_ranks: list[int]
    environment: str | None
    job_dir: str | None
    params: dict[str, str]
    mlflow_tags: dict[str, str]
    datasets: list[DatasetPin]
    staging: str | None
    after: list[Upstream]
    inputs: list[InputRead]
    promotion: Promotion | None


class JobPage(TypedDict):
    """``JobListOut``: a page of ``GET /jobs``."""

    jobs: list[Job]
    total: int
    columns: list[str]


class LogRanks(TypedDict):
    """``LogRanksOut``: the ranks a job has logs of."""

    job_id: int
    ranks: list[int]
    launcher: bool


class DryRun(TypedDict):
    """``DryRunOut``: where a job would run now, or why it would wait."""

    would_start: bool
    placement: list[dict[str, Any]] | None
    preempts: list[int]
    shrinks: list[int]
    position: int
    reason: str


# -- the runs table --------------------------------------------------------------------------
class Tags(TypedDict):
    """``TagsOut``: a job's tags after a change."""

    job_id: int
    tags: list[str]


class Deleted(TypedDict):
    """``DeletedOut``: what deleting a job removed."""

    job_id: int
    rows: dict[str, int]
    bytes_freed: int


class RunColumns(TypedDict):
    """``RunColumnsOut``: what a runs table can show."""

    hparams: list[str]
    metrics: list[str]
    projects: list[str]
    tags: list[str]


class RunNumbers(TypedDict):
    """``RunNumbersOut``: one job's numbers for one metric (``best``: by the metric's goal)."""

    job_id: int
    final: float | None
    final_step: int
    best: float | None
    min: float | None
    max: float | None
    last_mean: float | None
    last_count: int


class MetricNumbers(TypedDict):
    """``MetricNumbersOut``: a metric's goal (``"min"``, ``"max"`` or None), where it comes
    from, and the numbers of each job that logged it."""

    name: str
    goal: str | None
    goal_from: str | None
    runs: list[RunNumbers]


class Comparison(TypedDict):
    """``CompareOut``: ``GET /runs/compare``, the jobs' numbers per metric."""

    job_ids: list[int]
    last: int
    metrics: list[MetricNumbers]


# -- metrics ---------------------------------------------------------------------------------
class MetricSeries(TypedDict):
    """``SeriesOut``: a series with its points, ``(step, value, wall_time)``."""

    name: str
    rank: int | None
    points: list[tuple[int, float | None, float]]
    total_points: int
    downsampled: bool


class JobMetrics(TypedDict):
    """``MetricsOut``: ``GET /jobs/{id}/metrics`` (the client wraps it in a ``Metrics``)."""

    job_id: int
    series: list[MetricSeries]


class SeriesInfo(TypedDict):
    """``SeriesInfoOut``: a series without its points."""

    name: str
    rank: int | None
    points: int
    last_step: int


class SeriesList(TypedDict):
    """``SeriesListOut``: a job's series without their points."""

    job_id: int
    series: list[SeriesInfo]


# -- checkpoints -----------------------------------------------------------------------------
class Checkpoint(TypedDict):
    """``CheckpointOut``: a registered checkpoint."""

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
    kind: str  # "file" or "sharded"
    corrupt: str | None
    algorithm: str  # what "sha256" was made with: "sha256" or "blake3"


class CheckpointList(TypedDict):
    """``CheckpointListOut``: a job's checkpoints."""

    job_id: int
    directory: str | None
    checkpoints: list[Checkpoint]


class CheckpointFile(TypedDict):
    """``CheckpointFileOut``: a file of a checkpoint ("" for a file checkpoint)."""

    name: str
    size: int


class CheckpointFiles(TypedDict):
    """``CheckpointFilesOut``: a checkpoint and its files."""

    checkpoint: Checkpoint
    files: list[CheckpointFile]
