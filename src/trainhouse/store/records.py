"""Plain records the store hands out: no SQLAlchemy objects leave the store."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainhouse.lifecycle import JobState


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    owner: str
    state: JobState
    priority: str
    spec: dict[str, Any]
    archive_sha256: str
    created_at: float
    updated_at: float
    started_at: float | None = None
    ended_at: float | None = None
    attempts: int = 0
    restarts: int = 0
    infra_restarts: int = 0
    exit_code: int | None = None
    reason: str | None = None
    cancel_requested: bool = False
    preempt_requested: bool = False
    token_hash: str | None = None
    placement: dict[str, Any] | None = None
    total_steps: int | None = None
    last_step: int | None = None
    latest_metrics: dict[str, float] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("token_hash")
        data["state"] = str(self.state)
        return data


@dataclass(frozen=True)
class Attempt:
    job_id: int
    number: int
    started_at: float
    ended_at: float | None = None
    result: str | None = None
    exit_code: int | None = None
    rank_exit_codes: dict[str, int] | None = None
    placement: dict[str, Any] | None = None
    pid: int | None = None
    pid_create_time: float | None = None
    reason: str | None = None
    failure: str | None = None  # "user" | "infra"
    failed_rank: int | None = None
    log_tail: str | None = None


@dataclass(frozen=True)
class Event:
    at: float
    from_state: str | None
    to_state: str
    reason: str | None


@dataclass(frozen=True)
class Checkpoint:
    id: int
    job_id: int
    attempt: int
    step: int
    path: str
    size: int
    sha256: str
    metrics: dict[str, float | None]
    created_at: float
    deleted: bool = False
    kind: str = "file"
    corrupt: str | None = None


@dataclass(frozen=True)
class UserLimits:
    owner: str
    share: float = 1.0
    max_gpus: int | None = None
    max_cpus: int | None = None


@dataclass(frozen=True)
class MetricPoint:
    step: int
    name: str
    value: float | None  # None: the reported value was NaN or infinite
    rank: int | None = None
    attempt: int = 0
    wall_time: float = 0.0
