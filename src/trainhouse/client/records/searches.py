"""Records of hyperparameter searches and their trials.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import Any, TypedDict

__all__ = [
    "Search",
    "SearchBest",
    "SearchBestCheckpoint",
    "SearchDetail",
    "SearchList",
    "Trial",
]


# -- searches --------------------------------------------------------------------------------
class Trial(TypedDict):
    """``TrialOut``: a trial of a search (a job)."""

    number: int
    job_id: int
    state: str  # QUEUED, RUNNING, COMPLETED, PRUNED, FAILED
    params: dict[str, Any]
    value: float | None
    latest: float | None
    best: float | None
    last_step: int | None
    steps_reported: int
    reason: str | None
    started_at: float | None
    ended_at: float | None
    duration: float | None


class Search(TypedDict):
    """``SearchOut``: a search as lists and writes return it."""

    id: int
    name: str
    owner: str
    state: str  # RUNNING, COMPLETED, CANCELED
    reason: str | None
    warning: str | None
    method: str
    metric: str
    mode: str
    early_stopping: str
    max_trials: int
    max_concurrent: int
    created_at: float
    ended_at: float | None
    trial_counts: dict[str, int]


class SearchDetail(Search):
    """``SearchDetailOut``: a search with its spec, trials and best trial."""

    spec: dict[str, Any]
    trials: list[Trial]
    best: Trial | None


class SearchList(TypedDict):
    """``SearchListOut``: ``GET /searches``."""

    searches: list[Search]


class SearchBestCheckpoint(TypedDict):
    """``SearchBestCheckpoint``: the best trial's best checkpoint."""

    id: int
    step: int
    path: str
    metrics: dict[str, float | None]
    digest: str
    algorithm: str


class SearchBest(TypedDict):
    """``SearchBestOut``: the best completed trial, its hparams and checkpoint."""

    search_id: int
    trial: int
    job_id: int
    metric: str
    value: float | None
    params: dict[str, Any]
    hparams: dict[str, Any]
    checkpoint: SearchBestCheckpoint | None
