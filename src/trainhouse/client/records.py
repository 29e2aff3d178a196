"""What the client's calls return: the JSON objects of the REST API as ``TypedDict``s.

Each record mirrors one response model of the server (:mod:`trainhouse.server.schemas`, or a
route module's own), field for field; ``tests/unit/test_client_records.py`` holds the pairs and
fails when the two drift apart. They are types only: at run time each is the plain dict the
server sent, so ``job["state"]`` works as before and nothing here imports pydantic.

Where the server speaks an enum (a job's state, an attempt's result) the record says ``str``,
what the JSON holds; ``[step, value, wall_time]`` and other fixed-length arrays are typed as
tuples (JSON hands them over as lists, which index and unpack the same way).

No ``from __future__ import annotations`` here: the annotations are evaluated, so that
``typing.get_type_hints`` and ``__required_keys__`` see them as they are.
"""

from typing import Any, TypedDict

__all__ = [
    "Attempt",
    "AuditEntry",
    "AuditPage",
    "Checkpoint",
    "CheckpointFile",
    "CheckpointFiles",
    "CheckpointList",
    "Clone",
    "Deleted",
    "DryRun",
    "Env",
    "Envs",
    "Event",
    "GpuLive",
    "Health",
    "Job",
    "JobDetail",
    "JobMetrics",
    "JobPage",
    "Latency",
    "Limits",
    "LogRanks",
    "MetricSeries",
    "Model",
    "ModelDetail",
    "ModelFile",
    "ModelList",
    "ModelVersion",
    "NewToken",
    "Node",
    "Nodes",
    "Pruned",
    "Queue",
    "QueueEntry",
    "Quotas",
    "Replica",
    "RunColumns",
    "Search",
    "SearchBest",
    "SearchBestCheckpoint",
    "SearchDetail",
    "SearchList",
    "SeriesInfo",
    "SeriesList",
    "Service",
    "ServiceList",
    "ServiceStats",
    "SystemMetrics",
    "SystemSeries",
    "Tags",
    "Token",
    "TokenList",
    "Trial",
    "User",
    "UserList",
    "WhoAmI",
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
    resumes: int
    cloned_from: int | None
    cloned_step: int | None
    held: bool
    project: str
    tags: list[str]
    note: str | None
    archived: bool
    hparams: dict[str, Any] | None
    values: dict[str, float | str | None]


class Clone(TypedDict):
    """``CloneOut``: a job cloned from another (``JobDetail.clones``)."""

    id: int
    name: str
    state: str
    cloned_step: int | None


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


# -- the server and its machines -------------------------------------------------------------
class Health(TypedDict):
    """``HealthOut``: ``GET /health``."""

    status: str
    version: str
    home: str | None
    auth: bool


class GpuLive(TypedDict):
    """``GpuLiveOut``: a GPU's latest sample."""

    index: int
    util: float | None
    fb_used: float | None
    power: float | None
    temp: float | None


class Node(TypedDict):
    """``NodeOut``: a node, what it has free and its latest resource sample."""

    name: str
    cpus: int
    memory_bytes: int
    gpus: list[dict[str, Any]]
    free_cpus: int
    free_gpus: list[int]
    held: list[str]
    cpu_percent: float | None
    memory_used_bytes: int | None
    gpus_live: list[GpuLive]
    sampled_at: float | None


class Nodes(TypedDict):
    """``NodesOut``: ``GET /nodes``."""

    executor: str
    nodes: list[Node]


class SystemSeries(TypedDict):
    """``SystemSeriesOut``: a resource series, ``(at, value)`` points."""

    name: str
    gpu: int | None
    points: list[tuple[float, float]]
    max: list[float]


class SystemMetrics(TypedDict):
    """``SystemMetricsOut``: a node's or a job's resource series."""

    series: list[SystemSeries]


class Env(TypedDict):
    """``EnvOut``: a cached job environment."""

    digest: str
    size: int
    last_used: float
    in_use: bool
    jobs: list[str]


class Envs(TypedDict):
    """``EnvsOut``: the server machine's cache of job environments."""

    envs: list[Env]
    total_size: int
    max_size: int
    directory: str


class Pruned(TypedDict):
    """``PruneOut``: what pruning the environments removed."""

    removed: list[Env]
    kept_in_use: list[str]


# -- the scheduler ---------------------------------------------------------------------------
class QueueEntry(TypedDict):
    """``QueueEntry``: a waiting job and why it waits."""

    position: int
    id: int
    name: str
    owner: str
    priority: str
    created_at: float
    reason: str | None


class Queue(TypedDict):
    """``QueueOut``: ``GET /queue``."""

    jobs: list[QueueEntry]
    preempting: list[dict[str, Any]]


class Limits(TypedDict):
    """``LimitsOut``: a user's caps, weight and usage."""

    owner: str
    share: float
    max_gpus: int | None
    max_cpus: int | None
    usage: float


class Quotas(TypedDict):
    """``QuotasOut``: ``GET /quotas``."""

    default_max_gpus: int | None
    default_max_cpus: int | None
    half_life_seconds: float
    users: list[Limits]


# -- accounts --------------------------------------------------------------------------------
class WhoAmI(TypedDict):
    """``WhoAmIOut``: who the server takes the caller for."""

    name: str
    role: str
    job_id: int | None
    auth: bool
    job_visibility: str


class User(TypedDict):
    """``UserOut``."""

    name: str
    role: str
    created_at: float
    disabled_at: float | None


class UserList(TypedDict):
    """``UsersOut``: ``GET /users``."""

    users: list[User]


class Token(TypedDict):
    """``TokenOut``: an API token, without its secret."""

    id: int
    user: str
    name: str
    prefix: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    active: bool


class TokenList(TypedDict):
    """``TokensOut``: ``GET /tokens``."""

    tokens: list[Token]


class NewToken(TypedDict):
    """``NewTokenOut``: a new token and its secret (shown once)."""

    token: Token
    secret: str


class AuditEntry(TypedDict):
    """``AuditEntryOut``: an entry of the audit log."""

    id: int
    at: float
    actor: str
    action: str
    target: str | None
    ok: bool
    detail: dict[str, object] | None
    client: str | None


class AuditPage(TypedDict):
    """``AuditOut``: a page of the audit log."""

    entries: list[AuditEntry]
    total: int


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


# -- the model registry ----------------------------------------------------------------------
class ModelFile(TypedDict):
    """``ModelFileOut``: a file of a model version."""

    name: str
    size: int
    sha256: str


class ModelVersion(TypedDict):
    """``ModelVersionOut``: a version of a model."""

    model: str
    version: int
    job_id: int | None
    attempt: int
    step: int
    kind: str
    files: list[ModelFile]
    size: int
    metrics: dict[str, float | None]
    signature: dict[str, Any]
    record: dict[str, Any]
    created_at: float
    aliases: list[str]


class Model(TypedDict):
    """``ModelOut``: a model, its version count, newest version and aliases."""

    name: str
    owner: str
    created_at: float
    versions: int
    latest: int | None
    aliases: dict[str, int]


class ModelList(TypedDict):
    """``ModelListOut``: ``GET /models``."""

    models: list[Model]


class ModelDetail(TypedDict):
    """``ModelDetailOut``: a model and its versions."""

    model: Model
    versions: list[ModelVersion]


# -- services --------------------------------------------------------------------------------
class Replica(TypedDict):
    """``ReplicaOut``: a replica of a service (a rank of its job)."""

    rank: int
    attempt: int
    url: str
    version: int | None
    state: str
    error: str | None
    last_seen: float
    started_at: float
    requests: int
    batches: int
    examples: int


class Latency(TypedDict):
    """``LatencyOut``: latency percentiles, in milliseconds."""

    p50: float | None
    p95: float | None
    p99: float | None


class ServiceStats(TypedDict):
    """``ServiceStatsOut``: a service's recent traffic."""

    requests_total: int
    errors_total: int
    requests_per_s: float
    errors_per_s: float
    latency_ms: Latency
    mean_batch: float | None
    window_s: float


class Service(TypedDict):
    """``ServiceOut``: a service, its replicas and its traffic."""

    name: str
    owner: str
    model: str
    ref: str
    target_version: int | None
    problem: str | None
    version: int | None
    versions: list[int]
    state: str
    replicas: int
    ready_replicas: int
    replica_list: list[Replica]
    gpus_per_replica: int
    max_batch: int
    max_wait_ms: float
    priority: str
    job_id: int | None
    job_state: str | None
    created_at: float
    updated_at: float
    stats: ServiceStats


class ServiceList(TypedDict):
    """``ServiceListOut``: ``GET /services``."""

    services: list[Service]
