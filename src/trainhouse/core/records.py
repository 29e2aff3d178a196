"""Plain records the store hands out: no SQLAlchemy objects leave the store.

A :class:`Job` carries its spec parsed (:attr:`Job.spec`, a :class:`~trainhouse.core.spec.JobSpec`,
validated on first use: listing thousands of jobs parses none) and its placement typed; the API
shows them as stored (:meth:`Job.public`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from trainhouse.core.cluster import Placements, placements_to_json
from trainhouse.core.lifecycle import AttemptResult, FailureKind, JobState
from trainhouse.core.spec import JobSpec

__all__ = [
    "Attempt",
    "Checkpoint",
    "Dataset",
    "DatasetVersion",
    "Event",
    "Flow",
    "InputPin",
    "Job",
    "MetricPoint",
    "Model",
    "ModelVersion",
    "Promotion",
    "Search",
    "Trial",
    "UserLimits",
]


#: the kind of a job that is an MLflow run made outside the server: listed, never scheduled
TRACKED = "tracked"
LAUNCHED = "launched"


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    owner: str
    state: JobState
    priority: str
    spec_data: dict[str, Any]  # the spec as stored (a JobSpec's JSON)
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
    placement: Placements = ()  # where its latest attempt ran (none before its first)
    total_steps: int | None = None
    last_step: int | None = None
    latest_metrics: dict[str, float | None] = field(default_factory=dict)
    #: "launched" (run by an executor) or "tracked" (an MLflow run made outside a job)
    kind: str = "launched"
    search_id: int | None = None  # the search this job is a trial of (trainhouse.tune)
    prune_requested: bool = False  # the search's pruner stopped it
    resize_requested: bool = False  # an elastic job asked to stop for a resize

    resumes: int = 0  # times a user sent it back to the queue after it ended
    cloned_from: int | None = None  # the job it was cloned from
    cloned_step: int | None = None  # the step of that job's checkpoint it started from
    held: bool = False  # QUEUED but left alone by the scheduler (a clone being prepared)
    project: str = "default"
    hparams: dict[str, Any] | None = None  # what its SDK reported it ran with (None: nothing yet)
    note: str | None = None  # markdown
    archived: bool = False
    flow_id: int | None = None  # the flow it is a step of
    flow_step: str | None = None  # its step's name there

    @property
    def tracked(self) -> bool:
        return self.kind == TRACKED

    @cached_property
    def spec(self) -> JobSpec:
        """The job's spec, parsed."""
        return JobSpec.model_validate(self.spec_data)

    @property
    def max_runtime(self) -> int | None:
        """The spec's ``max_runtime`` (seconds), the spec parsed only when it has one: every
        report and checkpoint registration asks (should the attempt stop?), each of a job read
        anew, and parsing a spec cost more than the rest of the answer."""
        if "spec" not in self.__dict__ and not self.spec_data.get("max_runtime"):
            return None  # absent or null (or 0): JobSpec's None or 0, either no limit
        return self.spec.max_runtime

    def public(self) -> dict[str, Any]:
        """The job as the API shows it: the spec as stored, the placement as
        ``{"nodes": [...]}`` (None before its first attempt), no credential hash."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "token_hash"}
        data["spec"] = data.pop("spec_data")
        data["state"] = str(self.state)
        data["placement"] = placements_to_json(self.placement) if self.placement else None
        return data


@dataclass(frozen=True)
class Attempt:
    job_id: int
    number: int
    started_at: float
    ended_at: float | None = None
    result: AttemptResult | None = None
    exit_code: int | None = None
    rank_exit_codes: dict[str, int] | None = None
    placement: Placements = ()
    pid: int | None = None
    pid_create_time: float | None = None
    reason: str | None = None
    failure: FailureKind | None = None
    failed_rank: int | None = None
    log_tail: str | None = None

    def public(self) -> dict[str, Any]:
        """The attempt as the API shows it (the placement as ``{"nodes": [...]}``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["placement"] = placements_to_json(self.placement) if self.placement else None
        return data


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
    algorithm: str = "sha256"  # what ``sha256`` (the digest) was made with


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


@dataclass(frozen=True)
class Search:
    """A hyperparameter search (trainhouse.tune): its spec holds the distributions."""

    id: int
    name: str
    owner: str
    state: str  # RUNNING | COMPLETED | CANCELED
    spec_data: dict[str, Any]
    archive_sha256: str
    study: str  # Optuna's study name
    created_at: float
    updated_at: float
    ended_at: float | None = None
    reason: str | None = None
    warning: str | None = None

    @cached_property
    def spec(self) -> JobSpec:
        return JobSpec.model_validate(self.spec_data)


@dataclass(frozen=True)
class Trial:
    """One trial of a search: Optuna's trial and the job that runs it."""

    search_id: int
    number: int
    trial_id: int
    job_id: int
    params: dict[str, Any]
    state: str  # ACTIVE (read the job's) | COMPLETED | PRUNED | FAILED
    value: float | None
    created_at: float
    ended_at: float | None = None


@dataclass(frozen=True)
class ModelVersion:
    """One registered version of a model: the files a job saved and where they came from."""

    model: str
    version: int
    job_id: int | None
    attempt: int
    step: int
    path: str  # the version's directory in the job's checkpoint storage
    kind: str  # "export" | "loader"
    files: list[dict[str, Any]]  # [{"name", "size", "sha256"}]
    size: int
    metrics: dict[str, float | None]
    signature: dict[str, Any]
    record: dict[str, Any]
    created_at: float
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Model:
    name: str
    owner: str
    created_at: float
    versions: int  # how many versions it has now
    latest: int | None  # the newest version's number
    aliases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceRecord:
    """A served model: what it follows, how it is served, and the job running its replicas."""

    id: int
    name: str
    owner: str
    model: str
    ref: str  # an alias, "latest", or a version number (as text)
    replicas: int
    gpus_per_replica: int
    max_batch: int
    max_wait_ms: float
    priority: str
    stopped: bool
    job_id: int | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class DatasetVersion:
    """One version of a dataset: its manifest's digest, where its files are read from, what
    it holds. ``source`` None: the server's dataset storage (an uploaded directory)."""

    dataset: str
    version: int
    digest: str
    source: str | None
    storage_options: dict[str, str]
    files: int
    size: int  # bytes
    checksums: str  # "sha256", "md5" or "sha256+md5": how its files' digests were had
    description: str | None
    created_by: str
    created_at: float

    @property
    def ref(self) -> str:
        return f"{self.dataset}@{self.version}"


@dataclass(frozen=True)
class Dataset:
    name: str
    owner: str
    created_at: float
    versions: int  # how many versions it has now
    latest: int | None  # the newest version's number
    size: int | None  # the newest version's bytes


@dataclass(frozen=True)
class Flow:
    """Jobs submitted together as the steps of one flow: each step's job, its upstream steps
    and its inputs as submitted (upstreams first)."""

    id: int
    name: str
    owner: str
    created_at: float
    steps: list[dict[str, Any]]  # [{"name", "job_id", "after": [...], "inputs": {...}}]

    @property
    def jobs(self) -> dict[str, int]:
        return {str(s["name"]): int(s["job_id"]) for s in self.steps}


@dataclass(frozen=True)
class InputPin:
    """The model version a job read under ``key`` (``ref`` is what its spec said)."""

    job_id: int
    key: str
    ref: str
    model: str
    version: int
    digest: str
    attempt: int
    resolved_at: float

    @property
    def version_ref(self) -> str:
        return f"{self.model}@{self.version}"


@dataclass(frozen=True)
class Promotion:
    """A job's ``promote:`` and, once it completed, what was decided: ``promoted`` None while
    pending."""

    job_id: int
    alias: str
    metric: str
    mode: str
    model: str | None = None
    version: int | None = None
    value: float | None = None
    previous_version: int | None = None
    previous_value: float | None = None
    promoted: bool | None = None
    decision: str | None = None
    decided_at: float | None = None
