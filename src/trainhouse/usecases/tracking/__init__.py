"""Tracking: the MLflow view of trainhouse's jobs, as the MLflow-compatible API
(:mod:`trainhouse.server.mlflow`) serves it. A run is a job; experiments, runs, params, tags
and metrics are :mod:`.runs`, a run's files :mod:`.artifacts`; who calls and which job a
request may reach, :mod:`.callers`; what is refused,
:class:`~trainhouse.core.errors.InvalidTracking`
and :class:`~trainhouse.core.errors.ArtifactTooLarge`.

Each use case takes the runtime and the :class:`~.callers.Caller` ``c`` of the request (its
principal, the job scope it called, the token it presented), checks what ``c`` may do and
returns domain records or plain data; the API renders them in MLflow's shapes.
"""

from __future__ import annotations

from trainhouse.core.errors import ArtifactTooLarge, InvalidTracking
from trainhouse.usecases.tracking import artifacts, runs
from trainhouse.usecases.tracking.callers import Caller, caller, may_create, run_job
from trainhouse.usecases.tracking.runs import (
    RUN_STATUSES,
    Experiment,
    HistoryPage,
    LoggedPoint,
    MlflowRun,
    RunView,
)

__all__ = [
    "RUN_STATUSES",
    "ArtifactTooLarge",
    "Caller",
    "Experiment",
    "HistoryPage",
    "InvalidTracking",
    "LoggedPoint",
    "MlflowRun",
    "RunView",
    "artifacts",
    "caller",
    "may_create",
    "run_job",
    "runs",
]
