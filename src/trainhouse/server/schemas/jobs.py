"""The bodies of the job routes: a job, its attempts and events, the job page and the list,
resumes and clones (``POST /jobs/{id}/resume``, ``/clone``), and the ranks a job has logs of."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from trainhouse.core.lifecycle import AttemptResult, FailureKind, JobState
from trainhouse.server.schemas.common import NO_NUL
from trainhouse.server.schemas.datasets import PinOut


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
    resize_requested: bool = Field(
        False, description="An elastic job asked to stop at a checkpoint for a resize"
    )
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
    flow_id: int | None = Field(None, description="The flow it is a step of")
    flow_step: str | None = Field(None, description="Its step's name in that flow")
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


class ResumeIn(BaseModel):
    """``POST /jobs/{id}/resume`` and ``POST /flows/{id}/resume``: who asks (auth off only)."""

    model_config = {"extra": "forbid"}

    by: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The local user resuming (the client sends its user's name); ignored when "
        "auth is on: the token's user resumes. Null: the job's (or the flow's) owner",
    )


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


class UpstreamOut(BaseModel):
    job_id: int
    when: Literal["completed", "ended"]
    state: JobState | None = Field(description="null: the job was deleted (or is not yours)")


class InputOut(BaseModel):
    key: str
    ref: str = Field(description="What the spec said: job:31, digits-cnn@champion")
    model: str
    version: int
    attempt: int = Field(description="The attempt that resolved it")


class PromotionOut(BaseModel):
    alias: str
    metric: str
    mode: Literal["min", "max"]
    model: str | None = None
    version: int | None = None
    value: float | None = None
    previous_version: int | None = None
    previous_value: float | None = None
    promoted: bool | None = Field(
        None, description="null: not decided yet (the job has not completed)"
    )
    decision: str | None = Field(
        None, description="promoted v3 to champion: val_acc 0.95 > 0.91 (v1) / kept v1 as ..."
    )
    decided_at: float | None = None


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
    datasets: list[PinOut] = Field(
        default_factory=list, description="The dataset versions it reads, pinned at submit"
    )
    staging: str | None = Field(
        None,
        description='Where staging its datasets stands: "staging digits@2: 41% (120 of 290 MB)", '
        '"staging digits@2: ready in 3.10 s ...", "staging failed: ..."; null without datasets',
    )
    params: dict[str, str] = Field(
        default_factory=dict,
        description="The hparams the job's script reported (MLflow params), as strings",
    )
    after: list[UpstreamOut] = Field(
        default_factory=list, description="The jobs it waits for (after:), with their states"
    )
    inputs: list[InputOut] = Field(
        default_factory=list,
        description="The model version it read under each input, once resolved at its start",
    )
    promotion: PromotionOut | None = Field(
        None, description="Its promote: and, once it completed, what was decided"
    )
    mlflow_tags: dict[str, str] = Field(
        default_factory=dict, description="The job's MLflow tags (mlflow.* included)"
    )


class JobListOut(BaseModel):
    jobs: list[JobOut]
    total: int = Field(description="How many jobs match the filters, ignoring limit and offset")
    columns: list[str] = Field(default_factory=list, description="The columns' fields, in order")


class LogRanksOut(BaseModel):
    job_id: int
    ranks: list[int]
    launcher: bool
