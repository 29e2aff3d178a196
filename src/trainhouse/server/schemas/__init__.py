"""Request and response bodies of the REST API (published in /openapi.json), a module per
noun; every name is importable from here (``from trainhouse.server.schemas import JobOut``).

- :mod:`~trainhouse.server.schemas.common`: row ids, integer bounds, ``NO_NUL``, the error body
- :mod:`~trainhouse.server.schemas.jobs`: jobs, attempts, events, clones, log ranks
- :mod:`~trainhouse.server.schemas.runs`: tags, notes, archiving, deletion, hparams, columns
- :mod:`~trainhouse.server.schemas.metrics`: series and the SDK's report
- :mod:`~trainhouse.server.schemas.checkpoints`: checkpoints and their files
- :mod:`~trainhouse.server.schemas.system`: health, nodes, resource series
- :mod:`~trainhouse.server.schemas.searches`: searches and trials
- :mod:`~trainhouse.server.schemas.datasets`: datasets, versions, manifests
- :mod:`~trainhouse.server.schemas.models`: the model registry (the saved model's record:
  :mod:`trainhouse.core.modelrecord`)
"""

from trainhouse.core.modelrecord import (
    CheckpointSource,
    ModelFileOut,
    ModelName,
    SavedModelRecord,
    SignatureOut,
    TensorSpec,
)
from trainhouse.server.schemas.checkpoints import (
    CheckpointFileOut,
    CheckpointFilesOut,
    CheckpointIn,
    CheckpointListOut,
    CheckpointOut,
    CorruptIn,
)
from trainhouse.server.schemas.common import (
    INT32,
    INT64,
    NO_NUL,
    ErrorBody,
    ErrorOut,
    NulFree,
    RowId,
)
from trainhouse.server.schemas.datasets import (
    DatasetAddOut,
    DatasetDetailOut,
    DatasetFileOut,
    DatasetListOut,
    DatasetOut,
    DatasetSourceIn,
    DatasetVersionOut,
    ManifestOut,
    PinOut,
)
from trainhouse.server.schemas.jobs import (
    AttemptOut,
    CloneIn,
    CloneOut,
    EventOut,
    JobDetailOut,
    JobListOut,
    JobOut,
    LogRanksOut,
)
from trainhouse.server.schemas.metrics import (
    MetricName,
    MetricsOut,
    MetricTuple,
    Rank,
    ReportIn,
    ReportOut,
    SeriesInfoOut,
    SeriesListOut,
    SeriesOut,
    Step,
)
from trainhouse.server.schemas.models import (
    AliasIn,
    ModelDetailOut,
    ModelListOut,
    ModelOut,
    ModelRegisterIn,
    ModelVersionOut,
    OwnerIn,
    VersionFromJobIn,
)
from trainhouse.server.schemas.runs import (
    ArchiveIn,
    DeletedOut,
    HparamsIn,
    HparamsOut,
    NoteIn,
    RunColumnsOut,
    TagsIn,
    TagsOut,
)
from trainhouse.server.schemas.searches import (
    ImportancesOut,
    SearchBestCheckpoint,
    SearchBestOut,
    SearchCurvesOut,
    SearchDetailOut,
    SearchListOut,
    SearchOut,
    TrialCurveOut,
    TrialOut,
    TrialState,
)
from trainhouse.server.schemas.system import (
    GpuLiveOut,
    HealthOut,
    NodeOut,
    NodesOut,
    SystemMetricsOut,
    SystemSeriesOut,
)

__all__ = [
    "INT32",
    "INT64",
    "NO_NUL",
    "AliasIn",
    "ArchiveIn",
    "AttemptOut",
    "CheckpointFileOut",
    "CheckpointFilesOut",
    "CheckpointIn",
    "CheckpointListOut",
    "CheckpointOut",
    "CheckpointSource",
    "CloneIn",
    "CloneOut",
    "CorruptIn",
    "DatasetAddOut",
    "DatasetDetailOut",
    "DatasetFileOut",
    "DatasetListOut",
    "DatasetOut",
    "DatasetSourceIn",
    "DatasetVersionOut",
    "DeletedOut",
    "ErrorBody",
    "ErrorOut",
    "EventOut",
    "GpuLiveOut",
    "HealthOut",
    "HparamsIn",
    "HparamsOut",
    "ImportancesOut",
    "JobDetailOut",
    "JobListOut",
    "JobOut",
    "LogRanksOut",
    "ManifestOut",
    "MetricName",
    "MetricTuple",
    "MetricsOut",
    "ModelDetailOut",
    "ModelFileOut",
    "ModelListOut",
    "ModelName",
    "ModelOut",
    "ModelRegisterIn",
    "ModelVersionOut",
    "NodeOut",
    "NodesOut",
    "NoteIn",
    "NulFree",
    "OwnerIn",
    "PinOut",
    "Rank",
    "ReportIn",
    "ReportOut",
    "RowId",
    "RunColumnsOut",
    "SavedModelRecord",
    "SearchBestCheckpoint",
    "SearchBestOut",
    "SearchCurvesOut",
    "SearchDetailOut",
    "SearchListOut",
    "SearchOut",
    "SeriesInfoOut",
    "SeriesListOut",
    "SeriesOut",
    "SignatureOut",
    "Step",
    "SystemMetricsOut",
    "SystemSeriesOut",
    "TagsIn",
    "TagsOut",
    "TensorSpec",
    "TrialCurveOut",
    "TrialOut",
    "TrialState",
    "VersionFromJobIn",
]
