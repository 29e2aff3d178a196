"""The one exception tree of trainhouse.

::

    TrainhouseError                 base of everything trainhouse raises on purpose
    ├── SpecError                   a job spec is invalid (names the field and the line)
    ├── ArchiveError                a workdir cannot be packed or an upload cannot be unpacked
    │   └── UploadTooLarge          an uploaded workdir is over the server's limit (413)
    ├── BodyTooLarge                a request body is over its route's limit (413)
    ├── InvalidMetrics              a metric report or query breaks a rule (422)
    ├── InvalidMedia                an image, histogram or table a job logs is refused (422)
    ├── InvalidQuery                a runs-table filter, sort or column is refused (422)
    │   └── QueryError              an expression that does not parse: where, and the token
    ├── UnsafeFile                  a file a job left is not a plain file to read (an OSError)
    ├── ClientError                 the server answered a request with an error
    │   └── ServerUnreachable       no server answered at the URL that was tried
    ├── ServerStartError            a server started in a child process did not come up
    ├── Unauthorized                no token, or one that does not work (401)
    │   └── Refused                 a report's credential is not its job's current attempt's
    ├── Forbidden                   a token that may not do this (403)
    ├── RateLimited                 too many failed token uses from one address (429)
    ├── ServerBusy                  the server cannot take this now; retry (503, Retry-After)
    ├── StoreError                  the store refused an operation (409)
    │   ├── NotFound                no such job / checkpoint (404)
    │   ├── InvalidTransition       a job state change the lifecycle table forbids
    │   ├── AlreadyExists           a name that must be unique is taken (an MLflow experiment)
    │   └── ValueChanged            a value that keeps its first setting was given another
    ├── CheckpointError             a checkpoint cannot be written, found or verified
    │   └── NotEncodable            a state the SDK's format does not store (torch.save does)
    ├── ModelError                  a model cannot be saved, registered, found or verified (422)
    │   └── ExportFailed            torch's exporter could not export the model
    ├── ServiceUnavailable          a service has no ready replica to answer (503)
    ├── ReplicaFailed               a replica failed while answering a prediction (502)
    ├── BadReplica                  what a replica reported of itself is refused (422)
    ├── BadInput                    a prediction request the model cannot take (4xx)
    ├── EnvBuildError               a job's environment cannot be built (on the node)
    ├── DatasetError                a dataset cannot be registered, found or read (422)
    │   └── StagingError            a pinned version cannot be staged on a node (a file changed)
    ├── FlowError                   a flow, a dependency or a model input breaks a rule (422)
    ├── MlflowError                 an answer of the MLflow API, in MLflow's error shape
    ├── InvalidTracking             a tracking request (the MLflow API) breaks a rule (400)
    │   └── ArtifactTooLarge        an artifact past its own or its run's limit (413)
    ├── ResourceError               a job can never fit the inventory it was sent to
    └── ExecutorUnavailable         the executor the server was told to use cannot run
        └── RayUnavailable          Ray is not installed, or no cluster answers

Every message states the rule and the value that broke it. ``code`` and ``status`` say how the
error crosses the REST boundary (``{"error": {"code": ..., "message": ...}}``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyExists",
    "ArchiveError",
    "ArtifactTooLarge",
    "BadInput",
    "BadReplica",
    "BodyTooLarge",
    "CheckpointError",
    "ClientError",
    "DatasetError",
    "EnvBuildError",
    "ExecutorUnavailable",
    "ExportFailed",
    "FlowError",
    "Forbidden",
    "InvalidMedia",
    "InvalidMetrics",
    "InvalidQuery",
    "InvalidTracking",
    "InvalidTransition",
    "MlflowError",
    "ModelError",
    "NotEncodable",
    "NotFound",
    "QueryError",
    "RateLimited",
    "RayUnavailable",
    "Refused",
    "ReplicaFailed",
    "ResourceError",
    "ServerBusy",
    "ServerStartError",
    "ServerUnreachable",
    "ServiceUnavailable",
    "SpecError",
    "StagingError",
    "StoreError",
    "TrainhouseError",
    "Unauthorized",
    "UnsafeFile",
    "UploadTooLarge",
    "ValueChanged",
]


class TrainhouseError(Exception):
    """Base class of every error trainhouse raises on purpose."""

    #: Stable machine-readable code used in REST error bodies.
    code = "error"
    #: HTTP status used when the error crosses the REST boundary.
    status = 400


class SpecError(TrainhouseError):
    code = "invalid_spec"
    status = 422


class ArchiveError(TrainhouseError):
    code = "invalid_archive"
    status = 422


class UploadTooLarge(ArchiveError):
    code = "too_large"
    status = 413


class BodyTooLarge(TrainhouseError):
    """Raised into the app by the body-limit middleware's ``receive`` once a body is over."""

    code = "too_large"
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is over the {limit}-byte limit")
        self.limit = limit


class InvalidMetrics(TrainhouseError):
    """A metric report or query breaks a rule; the message names the rule and the value."""

    code = "invalid_request"
    status = 422


class InvalidMedia(TrainhouseError):
    """An image, histogram or table a job logs breaks a rule (a bound, a PNG that is not one,
    values none of which is finite); the message names the rule and the value."""

    code = "invalid_request"
    status = 422


class InvalidQuery(TrainhouseError):
    """A runs-table filter, sort or column that does not parse or cannot be compared; the
    message points at the bad token."""

    code = "invalid_request"
    status = 422


class QueryError(InvalidQuery, ValueError):
    """An expression that does not parse (:mod:`trainhouse.core.runquery`), with where:
    ``column`` (1-based) and ``token``."""

    def __init__(self, message: str, text: str, column: int, token: str) -> None:
        self.column = column
        self.token = token
        self.text = text
        self.reason = message
        caret = " " * (column - 1) + "^"
        super().__init__(f"{message} (column {column})\n  {text}\n  {caret}")


class UnsafeFile(TrainhouseError, OSError):
    """A file a job left behind that is not read (:mod:`trainhouse.jobfs.jobfiles`): a link, a
    FIFO, a device, a file with several hard links, one that changed while it was opened. An
    ``OSError`` (``errno`` says which), so code that treats an unreadable file as missing treats
    this one so too."""

    code = "unsafe_file"
    status = 422


class ClientError(TrainhouseError):
    """The server answered with an error body."""

    def __init__(self, message: str, *, status: int = 0, code: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServerUnreachable(ClientError):
    def __init__(self, url: str, cause: str) -> None:
        super().__init__(
            f"cannot reach the trainhouse server at {url} ({cause}); "
            "start one with `trainhouse server` or set TRAINHOUSE_URL",
            code="unreachable",
        )
        self.url = url


class ServerStartError(TrainhouseError):
    code = "server_start"


class Unauthorized(TrainhouseError):
    code = "unauthorized"
    status = 401


class Refused(Unauthorized):
    """The credential a report came with is not its job's current one (a stranger's, or the
    job's attempt ended); ``job`` is the job (:class:`trainhouse.core.records.Job`)."""

    def __init__(self, job: Any) -> None:
        super().__init__(f"the credential is not valid for job {job.id}'s current attempt")
        self.job = job


class Forbidden(TrainhouseError):
    code = "forbidden"
    status = 403


class RateLimited(TrainhouseError):
    code = "rate_limited"
    status = 429


class ServerBusy(TrainhouseError):
    """The server cannot take the request now (a full queue, a shutdown): retry after
    ``retry_after`` seconds (the answer's ``Retry-After``)."""

    code = "busy"
    status = 503

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreError(TrainhouseError):
    code = "store_error"
    status = 409


class NotFound(StoreError):
    code = "not_found"
    status = 404


class InvalidTransition(StoreError):
    code = "invalid_transition"
    status = 409


class AlreadyExists(StoreError):
    """A name that must be unique is taken (an MLflow experiment's)."""

    code = "already_exists"
    status = 409


class ValueChanged(StoreError):
    """A value that keeps its first setting was given another (an MLflow param)."""

    code = "value_changed"
    status = 409


class CheckpointError(TrainhouseError):
    code = "checkpoint_error"
    status = 422


class NotEncodable(CheckpointError):
    """The state holds something the SDK's checkpoint format does not store (the SDK writes it
    with torch.save instead: this never reaches a user)."""


class ModelError(TrainhouseError):
    code = "model_error"
    status = 422


class ExportFailed(ModelError):
    """torch's exporter could not export the model (its reason in the message)."""


class ServiceUnavailable(TrainhouseError):
    """A service that has no ready replica to answer (stopped, queued, starting)."""

    code = "service_unavailable"
    status = 503


class ReplicaFailed(TrainhouseError):
    """A replica that failed while answering a forwarded prediction."""

    code = "replica_failed"
    status = 502


class BadReplica(TrainhouseError):
    """What a replica reported of itself is refused (an address it may not claim)."""

    code = "bad_replica"
    status = 422


class BadInput(TrainhouseError):
    """A prediction request the model cannot take; ``status`` is its HTTP status (a 4xx)."""

    code = "invalid_input"

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class MlflowError(TrainhouseError):
    """An answer of the MLflow API (``/mlflow``) in MLflow's error shape:
    ``{"error_code": ..., "message": ...}``; ``code`` is MLflow's error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class EnvBuildError(TrainhouseError):
    """A job's environment cannot be built; the message says why (the resolver's own, for a
    failed resolution). Raised on the node, in the attempt's supervisor."""

    code = "env_build_failed"
    status = 422


class DatasetError(TrainhouseError):
    """A dataset cannot be registered, found or read: a source that cannot be listed, a path
    or name that breaks a rule, a manifest over its limits; the message names the rule and
    the value."""

    code = "dataset_error"
    status = 422


class StagingError(DatasetError):
    """A pinned version cannot be staged on a node: a file that changed since it was
    registered (its size or digest), a missing object, a permission refused, a full disk.
    ``transient`` is true for what may pass (a timeout, a 5xx): the attempt is tried again as
    an infrastructure failure; otherwise it fails with this message."""

    code = "staging_failed"

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class FlowError(TrainhouseError):
    """A flow file, a job's ``after:``, ``inputs:`` or ``promote:`` breaks a rule: a step
    named that does not exist, a cycle between steps, a job it may not wait on, an input that
    cannot be resolved; the message names the step or key and the value (422)."""

    code = "invalid_flow"
    status = 422


class InvalidTracking(TrainhouseError):
    """A tracking request breaks a rule (a path, a metric, a run's count of artifacts); the
    message names the rule and the value (MLflow's ``INVALID_PARAMETER_VALUE``, 400)."""

    code = "invalid_request"
    status = 400


class ArtifactTooLarge(InvalidTracking):
    """An artifact over ``Settings.mlflow_artifact_bytes``, or one that would take a run's
    artifacts past ``mlflow_run_artifact_bytes`` (413)."""

    code = "too_large"
    status = 413


class ResourceError(TrainhouseError):
    code = "unschedulable"
    status = 422


class ExecutorUnavailable(TrainhouseError):
    code = "executor_unavailable"


class RayUnavailable(ExecutorUnavailable):
    code = "ray_unavailable"
