"""The server's side of checkpoints, as the checkpointer sees it.

Under the server every checkpoint is registered (step, size, sha256), a restart asks the server
which checkpoints exist, and a checkpoint that fails verification is reported. A standalone run
has no server: :class:`LocalRegistry` answers for it, and the records written next to the
checkpoints are all there is.
"""

from __future__ import annotations

import contextlib
import sys
from abc import ABC, abstractmethod
from typing import Any

from trainhouse.jobfs.storage import Storage, sidecar_name
from trainhouse.sdk._server import ServerLink


class CheckpointRegistry(ABC):
    """Where checkpoints are registered and listed. ``attempt`` is the attempt whose saves these
    are (it goes in every record). Methods that talk to the server raise ClientError when it
    cannot be reached or refuses."""

    attempt: int

    @abstractmethod
    def listed(self) -> list[dict[str, Any]] | None:
        """The server's records of the job's checkpoints, or None where there is no server."""

    @abstractmethod
    def register(self, record: dict[str, Any], *, retry_for: float = 60.0) -> dict[str, Any]:
        """Register a checkpoint that is fully written; the record as registered (the server adds
        its id). Retries an unreachable server for up to ``retry_for`` seconds."""

    def register_with_metrics(
        self, record: dict[str, Any], *, retry_for: float = 60.0
    ) -> dict[str, Any]:
        """:meth:`flush_metrics`, then :meth:`register`: the metrics logged before the
        checkpoint are stored before it is registered (a registry may do both in one call).
        On a ClientError the metrics may not be stored: :meth:`persist_metrics` keeps them."""
        self.flush_metrics(retry_for=retry_for)
        return self.register(record, retry_for=retry_for)

    @abstractmethod
    def register_model(self, record: dict[str, Any]) -> dict[str, Any]:
        """Register the model ``record`` describes (``run.save_model``, fully written) as a
        new version; the record with ``version`` added where there is a server."""

    @abstractmethod
    def report_corrupt(self, checkpoint_id: int, reason: str) -> None:
        """Tell the server that checkpoint ``checkpoint_id`` failed verification."""

    @abstractmethod
    def defer(self, record: dict[str, Any]) -> bool:
        """Register ``record`` in the background once the server answers again, after the metrics
        logged before it. False where nothing can do that (then it is not registered)."""

    @abstractmethod
    def flush_metrics(self, retry_for: float = 60.0) -> None:
        """Send this rank's metrics logged so far, now (before a registration: a run resumed from
        the checkpoint must not miss a step logged before it)."""

    @abstractmethod
    def persist_metrics(self) -> bool:
        """Make this rank's metrics logged so far durable without the server (spooled and
        fsynced, sent once it answers); False when they cannot be."""

    @property
    @abstractmethod
    def sends_metrics(self) -> bool:
        """Whether this rank has metrics to send (whether ``flush_metrics`` does anything)."""

    @abstractmethod
    def resume_from(self, record: dict[str, Any] | None) -> None:
        """The run goes on from the checkpoint ``record`` (None: from the start): the server drops
        the steps after it that earlier attempts logged."""


class LocalRegistry(CheckpointRegistry):
    """No server (a standalone run): nothing to register, list or report. It says on the
    console when a run resumes from a checkpoint an earlier run left in ``location`` (and how to
    start fresh), and keeps only the newest ``keep_last`` there (the spec's default), as the
    server's retention would (:meth:`retain`)."""

    def __init__(
        self, attempt: int = 1, *, location: str = "", is_main: bool = True, keep_last: int = 2
    ) -> None:
        self.attempt = attempt
        self.location = location
        self.is_main = is_main
        self.keep_last = keep_last

    def listed(self) -> list[dict[str, Any]] | None:
        return None

    def register(self, record: dict[str, Any], *, retry_for: float = 60.0) -> dict[str, Any]:
        return record

    def register_model(self, record: dict[str, Any]) -> dict[str, Any]:
        return record

    def report_corrupt(self, checkpoint_id: int, reason: str) -> None:
        return None

    def defer(self, record: dict[str, Any]) -> bool:
        return False

    def flush_metrics(self, retry_for: float = 60.0) -> None:
        return None

    def persist_metrics(self) -> bool:
        return True  # nothing to send: the console has it all

    @property
    def sends_metrics(self) -> bool:
        return False

    def resume_from(self, record: dict[str, Any] | None) -> None:
        if record is None or not self.is_main:
            return
        print(
            f"trainhouse: resuming from the checkpoint of step {record['step']} that an earlier "
            f"run left in {self.location} ({record['path']}); to start fresh, move or delete "
            f"that directory (or set TRAINHOUSE_CHECKPOINT_URL to another one)",
            file=sys.stderr,
            flush=True,
        )

    def retain(self, storage: Storage, records: list[dict[str, Any]]) -> list[str]:
        """Delete all but the newest ``keep_last`` checkpoints of ``records`` (those found in
        ``storage``, with their records next to them); returns the names deleted."""
        newest = sorted(records, key=lambda r: int(r["step"]), reverse=True)
        dropped = []
        for old in newest[self.keep_last :]:
            for name in (old["path"], sidecar_name(old["path"])):
                with contextlib.suppress(OSError):
                    storage.delete(name)
            dropped.append(old["path"])
        return dropped


class ServerRegistry(CheckpointRegistry):
    """The job's checkpoints on the server, through the rank's :class:`ServerLink`: its API for
    the calls, its reporter (where this rank has one) for metrics and deferred registrations."""

    def __init__(self, link: ServerLink) -> None:
        self.link = link
        self.attempt = link.attempt

    def listed(self) -> list[dict[str, Any]] | None:
        return self.link.api.checkpoints()

    def register(self, record: dict[str, Any], *, retry_for: float = 60.0) -> dict[str, Any]:
        return self.link.api.register_checkpoint(record, retry_for=retry_for)

    def register_with_metrics(
        self, record: dict[str, Any], *, retry_for: float = 60.0
    ) -> dict[str, Any]:
        """One request: the points this rank logged before the checkpoint travel with its
        registration, stored first (:meth:`Reporter.register_with_points`)."""
        reporter = self.link.reporter
        if reporter is None:
            return self.register(record, retry_for=retry_for)
        return reporter.register_with_points(record, retry_for=retry_for)

    def register_model(self, record: dict[str, Any]) -> dict[str, Any]:
        answer = self.link.api.register_model(record["name"], record["path"])
        return {**record, "version": answer["version"]}

    def report_corrupt(self, checkpoint_id: int, reason: str) -> None:
        self.link.api.report_corrupt(checkpoint_id, reason)

    def defer(self, record: dict[str, Any]) -> bool:
        reporter = self.link.reporter
        if reporter is None:
            return False
        # the metric thread registers it once the server is back (a restart meanwhile finds it
        # by its record next to it)
        reporter.defer_checkpoint(record)
        return True

    def flush_metrics(self, retry_for: float = 60.0) -> None:
        if self.link.reporter is not None:
            self.link.reporter.flush(retry_for=retry_for)

    def persist_metrics(self) -> bool:
        return self.link.reporter is None or self.link.reporter.persist()

    @property
    def sends_metrics(self) -> bool:
        return self.link.reporter is not None

    def resume_from(self, record: dict[str, Any] | None) -> None:
        reporter = self.link.reporter
        if reporter is not None and self.attempt > 1:
            reporter.resume_step = int(record["step"]) if record else -1
