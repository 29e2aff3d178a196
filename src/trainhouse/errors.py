"""The one exception tree of trainhouse.

::

    TrainhouseError                 base of everything trainhouse raises on purpose
    ├── SpecError                   a job spec is invalid (names the field and the line)
    ├── ArchiveError                a workdir cannot be packed or an upload cannot be unpacked
    ├── ClientError                 the server answered a request with an error
    │   └── ServerUnreachable       no server answered at the URL that was tried
    ├── StoreError                  the store refused an operation
    │   ├── NotFound                no such job / checkpoint
    │   └── InvalidTransition       a job state change the lifecycle table forbids
    ├── CheckpointError             a checkpoint cannot be written, found or verified
    └── ResourceError               a job can never fit the inventory it was sent to

Every message states the rule and the value that broke it.
"""

from __future__ import annotations


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


class ResourceError(TrainhouseError):
    code = "unschedulable"
    status = 422
