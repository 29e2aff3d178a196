"""Request and response bodies of the REST API (published in /openapi.json)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, Field

from trainhouse.core.lifecycle import AttemptResult, FailureKind, JobState
from trainhouse.core.modelrecord import NO_NUL as NO_NUL
from trainhouse.core.modelrecord import (
    ModelFileOut,
    ModelName,
    TensorSpec,
)
from trainhouse.core.reports import INT32 as INT32
from trainhouse.core.reports import INT64 as INT64

#: A row id in a URL path (``/jobs/{job_id}``, ``/tokens/{token_id}``): the database's 64-bit
#: integer range. No row has an id outside it, and PostgreSQL refuses to even compare one with
#: a BIGINT column (an error, not "no such row"), so the request is refused before it gets there.
RowId = Annotated[int, Path(ge=-INT64 - 1, le=INT64)]

#: An item of a repeatable query parameter under that rule (``?action=a&action=b``).
NulFree = Annotated[str, Field(pattern=NO_NUL)]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class AttemptOut(BaseModel):
    number: int
    started_at: float
    ended_at: float | None
    result: AttemptResult | None
    exit_code: int | None
    rank_exit_codes: dict[str, int] | None
    placement: dict[str, Any] | None
    pid: int | None
    reason: str | None
    failure: FailureKind | None = Field(
        None, description='"user" (the job\'s code failed) or "infra" (killed from outside, lost)'
    )
    failed_rank: int | None = Field(None, description="The rank that failed first")
    log_tail: str | None = Field(None, description="The failing rank's last log lines")


class EventOut(BaseModel):
    at: float
    from_state: JobState | None
    to_state: JobState
    reason: str | None


class JobOut(BaseModel):
    id: int
    name: str
    owner: str
    state: JobState
    priority: str
    created_at: float
    updated_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    restarts: int
    infra_restarts: int = 0
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
    kind: str = Field(
        "launched",
        description='"launched" (run by the server) or "tracked" (an MLflow run made outside a '
        "job, listed here: tracked, not launched)",
    )
    search_id: int | None = Field(None, description="The search this job is a trial of")
    prune_requested: bool = Field(False, description="The search's pruner stopped it")
    resumes: int = Field(0, description="Times it was resumed after it ended (trainhouse resume)")
    cloned_from: int | None = Field(None, description="The job it was cloned from")
    cloned_step: int | None = Field(
        None, description="The step of the checkpoint of that job it started from"
    )
    held: bool = Field(False, description="Queued, not yet schedulable: a clone being prepared")
    project: str = "default"
    tags: list[str] = Field(default_factory=list)
    note: str | None = Field(
        None, description="Markdown, edited on the job page or `trainhouse note`"
    )
    archived: bool = False
    hparams: dict[str, Any] | None = Field(
        None,
        description="The hparams the run used (the script's defaults merged with the spec's), "
        "as its SDK reported them; null until it did (the spec's are in spec.hparams)",
    )
    values: dict[str, float | str | None] = Field(
        default_factory=dict,
        description="The columns asked for (?columns=): by field name, such as hparams.lr or "
        "metrics.val_loss.min; a job without the value has no entry",
    )


class CloneOut(BaseModel):
    id: int
    name: str
    state: JobState
    cloned_step: int | None


class CloneIn(BaseModel):
    """``POST /jobs/{id}/clone``: the new job's overrides and where it starts."""

    model_config = {"extra": "forbid"}

    set: list[Annotated[str, Field(max_length=4096, pattern=NO_NUL)]] = Field(
        default_factory=list,
        max_length=200,
        description="Overrides of the spec, as `--set`: ['hparams.lr=0.1', 'name=b']",
    )
    from_checkpoint: str | None = Field(
        None,
        pattern=r"^(latest|\d{1,18})$",
        description="'latest' or a step: start from a copy of that checkpoint of the job "
        "(null: start fresh)",
    )


class JobDetailOut(JobOut):
    attempt_history: list[AttemptOut]
    events: list[EventOut]
    checkpoints: int
    clones: list[CloneOut] = Field(
        default_factory=list, description="The jobs cloned from this one that the caller may see"
    )
    log_ranks: list[int]
    environment: str | None = Field(
        None,
        description='Where the latest attempt\'s environment stands: "setting up environment", '
        '"environment built in 3.2 s", "environment reused in 0.1 s", "environment failed"; '
        "null for a job without one",
    )
    job_dir: str | None = Field(
        None,
        description="Where the server keeps the job's files; null unless the caller is an admin",
    )
    params: dict[str, str] = Field(
        default_factory=dict,
        description="The hparams the job's script reported (MLflow params), as strings",
    )
    mlflow_tags: dict[str, str] = Field(
        default_factory=dict, description="The job's MLflow tags (mlflow.* included)"
    )


class JobListOut(BaseModel):
    jobs: list[JobOut]
    total: int = Field(description="How many jobs match the filters, ignoring limit and offset")
    columns: list[str] = Field(default_factory=list, description="The columns' fields, in order")


class TagsIn(BaseModel):
    add: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=32)
    remove: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=32)


class TagsOut(BaseModel):
    job_id: int
    tags: list[str]


class NoteIn(BaseModel):
    note: str = Field(max_length=65536, pattern=NO_NUL, description="Markdown; empty clears it")


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


class CorruptIn(BaseModel):
    reason: str = Field(min_length=1, max_length=2000, pattern=NO_NUL)


Step = Annotated[int, Field(ge=0, le=INT64)]
MetricName = Annotated[str, Field(min_length=1, max_length=256)]
Rank = Annotated[int, Field(ge=0, le=1_000_000)]
MetricTuple = tuple[Step, MetricName, float | None, Rank | None, float]


class ReportIn(BaseModel):
    """One flush of the SDK's buffer: metric points plus a heartbeat.

    The wire format, published here; the route checks it by hand, column by column
    (``trainhouse.store.metrics.parse_report``), with the same rules."""

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


class LogRanksOut(BaseModel):
    job_id: int
    ranks: list[int]
    launcher: bool


class GpuLiveOut(BaseModel):
    index: int
    util: float | None = Field(None, description="DCGM_FI_DEV_GPU_UTIL, %")
    fb_used: float | None = Field(None, description="DCGM_FI_DEV_FB_USED, MiB")
    power: float | None = Field(None, description="DCGM_FI_DEV_POWER_USAGE, W")
    temp: float | None = Field(None, description="DCGM_FI_DEV_GPU_TEMP, C")


class NodeOut(BaseModel):
    name: str
    cpus: int
    memory_bytes: int
    gpus: list[dict[str, Any]]
    free_cpus: int
    free_gpus: list[int]
    held: list[str] = Field(
        default_factory=list, description="Why GPUs of the node are not offered now"
    )
    # the latest resource sample (null/empty when the node has none)
    cpu_percent: float | None = Field(None, description="Of all cores, 0-100")
    memory_used_bytes: int | None = Field(None, description="Total minus available")
    gpus_live: list[GpuLiveOut] = Field(
        default_factory=list, description="Per GPU NVML sees; empty without NVIDIA's driver"
    )
    sampled_at: float | None = None


class NodesOut(BaseModel):
    executor: str
    nodes: list[NodeOut]


class HealthOut(BaseModel):
    status: str
    version: str
    home: str | None = Field(None, description="The server's state directory (auth off only)")
    auth: bool = Field(False, description="Whether the server checks tokens")


class SystemSeriesOut(BaseModel):
    name: str
    gpu: int | None = Field(None, description="The GPU's index, for per-GPU values")
    points: list[tuple[float, float]] = Field(
        description="[at, value]: unix time and value, or a time bucket's averages"
    )
    max: list[float] = Field(description="Each point's maximum (its value when not averaged)")


class SystemMetricsOut(BaseModel):
    series: list[SystemSeriesOut]


# -- searches (trainhouse.tune) --------------------------------------------------------------
TrialState = Literal["QUEUED", "RUNNING", "COMPLETED", "PRUNED", "FAILED"]


class TrialOut(BaseModel):
    number: int = Field(description="Optuna's trial number in the search's study")
    job_id: int
    state: TrialState
    params: dict[str, Any] = Field(description="The sampled hparams, by dotted name")
    value: float | None = Field(description="The objective Optuna was told (COMPLETED)")
    latest: float | None = Field(description="The objective at the last reported step")
    best: float | None = Field(description="The best objective reported at any step")
    last_step: int | None
    steps_reported: int
    reason: str | None
    started_at: float | None
    ended_at: float | None
    duration: float | None


class SearchOut(BaseModel):
    id: int
    name: str
    owner: str
    state: Literal["RUNNING", "COMPLETED", "CANCELED"]
    reason: str | None
    warning: str | None = Field(description="Said once: e.g. the metric a trial never logged")
    method: str
    metric: str
    mode: str
    early_stopping: str
    max_trials: int
    max_concurrent: int
    created_at: float
    ended_at: float | None
    trial_counts: dict[str, int]


class SearchDetailOut(SearchOut):
    spec: dict[str, Any]
    trials: list[TrialOut]
    best: TrialOut | None


class SearchListOut(BaseModel):
    searches: list[SearchOut]


class SearchBestCheckpoint(BaseModel):
    id: int
    step: int
    path: str
    metrics: dict[str, float | None]
    digest: str
    algorithm: str


class SearchBestOut(BaseModel):
    search_id: int
    trial: int
    job_id: int
    metric: str
    value: float | None
    params: dict[str, Any]
    hparams: dict[str, Any] = Field(description="The best trial's whole hparams")
    checkpoint: SearchBestCheckpoint | None


class TrialCurveOut(BaseModel):
    number: int
    job_id: int
    state: TrialState
    steps: list[int]
    values: list[float | None]


class SearchCurvesOut(BaseModel):
    trials: list[TrialCurveOut]


class ImportancesOut(BaseModel):
    importances: dict[str, float] | None = Field(
        description="Optuna's get_param_importances; null until enough trials completed"
    )
    completed: int
    needed: int


# -- the model registry ----------------------------------------------------------------------
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


class ModelDetailOut(BaseModel):
    model: ModelOut
    versions: list[ModelVersionOut]
