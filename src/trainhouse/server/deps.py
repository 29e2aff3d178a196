"""What route handlers depend on: the running services (who may do what: ``auth``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from trainhouse.errors import RateLimited
from trainhouse.layout import JobLayout
from trainhouse.monitoring.sampler import Sampler
from trainhouse.monitoring.telemetry import Telemetry
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.server.checkpoints import Checkpoints
from trainhouse.server.housekeeping import Housekeeper
from trainhouse.server.models import ModelFiles
from trainhouse.server.serving import ServingHub
from trainhouse.server.settings import Settings
from trainhouse.server.tensorboard import TensorBoardImport
from trainhouse.service import Service
from trainhouse.store import BlobStore, Store
from trainhouse.store.groupcommit import ReportWriter
from trainhouse.tune.service import SearchService

if TYPE_CHECKING:
    from trainhouse.server.auth import Authenticator


class StreamSlots:
    """The log streams open now, per user and in all: a stream takes a slot before it starts
    (:meth:`acquire`) and gives it back when it ends, however it ends."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, user: str, *, per_user: int, total: int) -> Callable[[], None]:
        """A slot for ``user``; returns what gives it back (idempotent). Raises 429 when
        ``user`` has ``per_user`` streams open, or the server ``total``."""
        with self._lock:
            mine, everyone = self._open.get(user, 0), sum(self._open.values())
            if mine >= per_user:
                raise RateLimited(
                    f"{user} has {mine} log streams open, the most one user may "
                    f"(log_streams_per_user); close one first"
                )
            if everyone >= total:
                raise RateLimited(
                    f"the server has {everyone} log streams open, the most it allows "
                    "(log_streams); try again later"
                )
            self._open[user] = mine + 1
        held = [True]

        def release() -> None:
            with self._lock:
                if not held:
                    return
                held.clear()
                left = self._open[user] - 1
                if left:
                    self._open[user] = left
                else:
                    del self._open[user]

        return release

    def open(self, user: str | None = None) -> int:
        """Streams open now: ``user``'s, or everyone's."""
        with self._lock:
            return sum(self._open.values()) if user is None else self._open.get(user, 0)


@dataclass
class Services:
    """What the app runs: the store, the background services, and what requests need."""

    settings: Settings
    store: Store  # jobs, checkpoints, metrics, quotas, accounts, resource samples
    blobs: BlobStore
    scheduler: SchedulerLoop
    checkpoints: Checkpoints  # where checkpoints live; retention
    monitor: Sampler  # resource samples
    housekeeper: Housekeeper  # log retention
    telemetry: Telemetry  # /metrics
    auth: Authenticator  # tokens -> principals (trainhouse.server.auth)
    reports: ReportWriter  # metric reports, stored in group commits
    tune: SearchService  # hyperparameter searches (trainhouse.tune)
    models: ModelFiles  # the model registry's files: registration, downloads
    serving: ServingHub  # services' replicas and the predictions forwarded to them
    streams: StreamSlots = field(default_factory=StreamSlots)  # open log streams
    tensorboard: TensorBoardImport | None = None  # event files imported as metrics

    @property
    def background(self) -> list[Service]:
        """The app's background services, in the order they start (they stop in reverse):
        retention before the scheduler, whose last exits register checkpoints; searches after
        the scheduler, which starts their trials."""
        found = [self.checkpoints, self.scheduler, self.tune, self.monitor, self.housekeeper]
        return found + ([self.tensorboard] if self.tensorboard is not None else [])

    def files(self, job_id: int) -> JobLayout:
        return JobLayout(self.settings.home, job_id)


async def services(request: Request) -> Services:
    """The app's services (async: a plain def dependency costs every request a hop to a
    worker thread and back)."""
    svc: Services = request.app.state.services
    return svc
