"""The bodies of the search routes (:mod:`trainhouse.tune`): a search, its trials, the best
trial with its checkpoint, the trials' curves and the hparams' importances."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

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
