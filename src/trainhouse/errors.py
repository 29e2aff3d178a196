"""The one exception tree of trainhouse.

::

    TrainhouseError                 base of everything trainhouse raises on purpose
    ├── SpecError                   a job spec is invalid (names the field and the line)
    ├── ArchiveError                a workdir cannot be packed or an upload cannot be unpacked
    │   └── UploadTooLarge          an uploaded workdir is over the server's limit (413)
    ├── BodyTooLarge                a request body is over its route's limit (413)
    ├── InvalidMetrics              a metric report or query breaks a rule (422)
    ├── ClientError                 the server answered a request with an error
    │   └── ServerUnreachable       no server answered at the URL that was tried
    ├── ServerStartError            a server started in a child process did not come up
    ├── Unauthorized                no token, or one that does not work (401)
    ├── Forbidden                   a token that may not do this (403)
    ├── RateLimited                 too many failed token uses from one address (429)
    ├── ServerBusy                  the server cannot take this now; retry (503, Retry-After)
    ├── StoreError                  the store refused an operation
    │   ├── NotFound                no such job / checkpoint
    │   └── InvalidTransition       a job state change the lifecycle table forbids
    ├── CheckpointError             a checkpoint cannot be written, found or verified
    ├── ModelError                  a model cannot be saved, registered, found or verified (422)
    ├── ResourceError               a job can never fit the inventory it was sent to
    └── ExecutorUnavailable         the executor the server was told to use cannot run
        └── RayUnavailable          Ray is not installed, or no cluster answers

Every message states the rule and the value that broke it. ``code`` and ``status`` say how the
error crosses the REST boundary (``{"error": {"code": ..., "message": ...}}``).
"""

from __future__ import annotations

__all__ = [
    "ArchiveError",
    "BadReplica",
    "BodyTooLarge",
    "CheckpointError",
    "ClientError",
    "ExecutorUnavailable",
    "Forbidden",
    "InvalidMetrics",
    "InvalidQuery",
    "InvalidTransition",
    "ModelError",
    "NotFound",
    "RateLimited",
    "RayUnavailable",
    "ReplicaFailed",
    "ResourceError",
    "ServerBusy",
    "ServerStartError",
    "ServerUnreachable",
    "ServiceUnavailable",
    "SpecError",
    "StoreError",
    "TrainhouseError",
    "Unauthorized",
    "UploadTooLarge",
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


class InvalidQuery(TrainhouseError):
    """A runs-table filter, sort or column that does not parse or cannot be compared; the
    message points at the bad token."""

    code = "invalid_request"
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


class CheckpointError(TrainhouseError):
    code = "checkpoint_error"
    status = 422


class ModelError(TrainhouseError):
    code = "model_error"
    status = 422


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


class ResourceError(TrainhouseError):
    code = "unschedulable"
    status = 422


class ExecutorUnavailable(TrainhouseError):
    code = "executor_unavailable"


class RayUnavailable(ExecutorUnavailable):
    code = "ray_unavailable"
