"""What the client's calls return: the JSON objects of the REST API as ``TypedDict``s, one
module per noun (``jobs``, ``system``, ``accounts``, ``searches``, ``registry``), all of them
importable from here.

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

from trainhouse.client.records.accounts import (
    AuditEntry,
    AuditPage,
    NewToken,
    Token,
    TokenList,
    User,
    UserList,
    WhoAmI,
)
from trainhouse.client.records.jobs import (
    Attempt,
    Checkpoint,
    CheckpointFile,
    CheckpointFiles,
    CheckpointList,
    Clone,
    Deleted,
    DryRun,
    Event,
    Job,
    JobDetail,
    JobMetrics,
    JobPage,
    LogRanks,
    MetricSeries,
    RunColumns,
    SeriesInfo,
    SeriesList,
    Tags,
)
from trainhouse.client.records.registry import (
    Latency,
    Model,
    ModelDetail,
    ModelFile,
    ModelList,
    ModelVersion,
    Replica,
    Service,
    ServiceList,
    ServiceStats,
)
from trainhouse.client.records.searches import (
    Search,
    SearchBest,
    SearchBestCheckpoint,
    SearchDetail,
    SearchList,
    Trial,
)
from trainhouse.client.records.system import (
    Env,
    Envs,
    GpuLive,
    Health,
    Limits,
    Node,
    Nodes,
    Pruned,
    Queue,
    QueueEntry,
    Quotas,
    SystemMetrics,
    SystemSeries,
)

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
