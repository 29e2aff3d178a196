"""What the server runs, built once: the store, the background loops and what requests need.

:class:`Runtime` is the container the use cases and the routes are handed; :func:`build_runtime`
makes it from the settings (the composition root: every part is made here and nowhere else).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from trainhouse.core.background import BackgroundLoop, WorkPool
from trainhouse.core.errors import RateLimited
from trainhouse.core.lifecycle import JobState
from trainhouse.executors import registry
from trainhouse.executors.base import Executor
from trainhouse.executors.inventory import server_mask
from trainhouse.ingest.checkpoints import Checkpoints
from trainhouse.ingest.datasetfiles import DatasetFiles
from trainhouse.ingest.groupcommit import ReportWriter
from trainhouse.ingest.logretention import LogRetention
from trainhouse.ingest.prefetch import DatasetPrefetch
from trainhouse.ingest.savedmodels import SavedModels
from trainhouse.ingest.tensorboard import TensorBoardImport
from trainhouse.jobfs.layout import JobLayout
from trainhouse.monitoring.sampler import Sampler
from trainhouse.monitoring.telemetry import Telemetry
from trainhouse.scheduler.loop import SchedulerConfig, SchedulerLoop
from trainhouse.scheduler.policy import Quota
from trainhouse.store import BlobStore, Store
from trainhouse.tune.runner import SearchRunner
from trainhouse.usecases.access import Authenticator
from trainhouse.usecases.replicahub import ReplicaHub
from trainhouse.usecases.settings import Settings

log = logging.getLogger(__name__)


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
class Runtime:
    """What the app runs: the store, the background loops, and what requests need."""

    settings: Settings
    store: Store  # jobs, checkpoints, metrics, quotas, accounts, resource samples
    blobs: BlobStore
    scheduler: SchedulerLoop
    checkpoints: Checkpoints  # where checkpoints live; retention
    monitor: Sampler  # resource samples
    log_retention: LogRetention  # logs of long-ended jobs deleted
    telemetry: Telemetry  # /metrics
    auth: Authenticator  # tokens -> principals (trainhouse.usecases.access)
    reports: ReportWriter  # metric reports, stored in group commits
    tune: SearchRunner  # hyperparameter searches (trainhouse.tune)
    saved_models: SavedModels  # the model registry's files: registration, downloads
    replicas: ReplicaHub  # services' replicas and the predictions forwarded to them
    dataset_files: DatasetFiles  # the server's dataset storage: manifests, uploaded files
    streams: StreamSlots = field(default_factory=StreamSlots)  # open log streams
    tensorboard: TensorBoardImport | None = None  # event files imported as metrics
    prefetch: DatasetPrefetch | None = None  # the next jobs' datasets staged ahead
    # jobs' files hashed or copied for requests (trainhouse.usecases.filework)
    file_work: WorkPool = field(default_factory=lambda: file_pool(Settings))
    _started: list[BackgroundLoop] = field(default_factory=list, init=False, repr=False)

    @property
    def background(self) -> list[BackgroundLoop]:
        """The app's background loops, in the order they start (they stop in reverse):
        retention before the scheduler, whose last exits register checkpoints; searches after
        the scheduler, which starts their trials, and their pruner's feed after them."""
        found = [self.checkpoints, self.scheduler, self.tune, self.tune.prunes, self.monitor]
        found.append(self.log_retention)
        found += [self.tensorboard] if self.tensorboard is not None else []
        return found + ([self.prefetch] if self.prefetch is not None else [])

    def files(self, job_id: int) -> JobLayout:
        return JobLayout(self.settings.home, job_id)

    def start(self) -> None:
        """Start the report writer and the background loops, in order (if one fails to start,
        :meth:`close` stops those that started)."""
        self.reports.start()  # first and last: reports answered before the end are stored
        self._discard_interrupted_clones()
        for loop in self.background:
            loop.start()
            self._started.append(loop)

    def _discard_interrupted_clones(self) -> None:
        """A clone is held until its checkpoint is copied, by the request that made it; one
        held at start-up lost that request with the previous server: its copy is deleted and
        the job with it, as when a copy fails (the request never answered with its id)."""
        for job in self.store.jobs.list(states=[JobState.QUEUED]):
            if job.held and job.attempts == 0:
                self.checkpoints.remove_all(job.id)
                self.store.jobs.discard(job.id)
                log.warning(
                    "job %s (a clone of job %s) was discarded: the server stopped while its "
                    "checkpoint was being copied; clone it again",
                    job.id,
                    job.cloned_from,
                )

    async def close(self) -> None:
        """Stop what :meth:`start` started, in reverse; store what is queued; close the
        replicas' connections and the store."""
        try:
            for loop in reversed(self._started):
                loop.stop()
            self._started.clear()
            self.reports.stop()  # stores what is queued
            self.file_work.stop()  # what waits is refused; what runs gives up
            await self.replicas.aclose()
        finally:
            self.store.close()


def build_runtime(settings: Settings, executor: Executor | None = None) -> Runtime:
    """Every part of the server, made from ``settings`` (``executor``: instead of the one
    ``settings.executor`` names)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    if executor is None:
        executor = registry.build(settings)
    node = executor.server_node()
    store = Store(settings.database_url, migrate="auto")  # PostgreSQL: `db upgrade` first
    blobs = BlobStore(settings.home / "blobs")
    checkpoints = Checkpoints(store, settings.home, settings.checkpoint_url)
    loop = SchedulerLoop(
        store,
        blobs,
        executor,
        home=settings.home,
        server_url=settings.url,
        tick=settings.tick,
        cancel_grace=settings.cancel_grace,
        shutdown_grace=settings.shutdown_grace,
        checkpoint_location=checkpoints.location,
        config=SchedulerConfig(
            half_life=settings.fairshare_half_life,
            max_infra_restarts=settings.max_infra_restarts,
            default_quota=Quota(settings.quota_gpus, settings.quota_cpus),
        ),
        env_defaults=settings.env_defaults,
    )

    def allocations() -> dict[int, list[int]]:  # running job -> its GPUs on this node
        running = store.jobs.list(states=[JobState.RUNNING])
        return {j.id: [g for p in j.placement if p.node == node for g in p.gpus] for j in running}

    monitor = Sampler(
        store.system,
        executor,
        node=node,
        interval=settings.monitor_interval,
        retention=settings.monitor_retention,
        allocations=allocations,
        gpu_mask=server_mask(),
    )
    telemetry = Telemetry()
    telemetry.watch(
        store, store.system, executor, stale_after=max(3 * settings.monitor_interval, 15.0)
    )
    loop.decision_observer = telemetry.decision_seconds.observe
    auth = Authenticator(
        store.accounts,
        enabled=settings.auth_enabled,
        limit=settings.auth_failures,
        window=settings.auth_window,
    )
    if _as_root():
        log.warning(
            "the server runs as root, and so does every job it starts: a training script can "
            "do anything on this machine, and keeping the server's processes non-dumpable does "
            "not keep the database's password from it. Run the server as a user of its own "
            "(docs/production.md, section 1)"
        )
    if auth.enabled and not store.accounts.has_admin():
        log.warning(
            "auth is on and there is no admin yet: run `trainhouse admin init` on this machine"
        )
    writers = settings.report_writers or (1 if store.dialect == "sqlite" else 4)
    reports = ReportWriter(store, writers=writers, queue_points=settings.report_queue_points)
    tune = SearchRunner(
        store,
        db_url=settings.database_url,
        home=settings.home,
        wake_scheduler=loop.wake,
        interval=max(settings.tick, 0.1),
    )
    tensorboard = TensorBoardImport(
        store,
        reports,
        settings.home,
        interval=settings.tensorboard_interval,
        on_stored=tune.on_report,  # a trial's scalars feed its search's pruner too
    )

    def attempt_ended(job_id: int, attempt: int) -> None:  # before the scheduler records it
        checkpoints.attempt_ended(job_id, attempt)
        if tensorboard.enabled:  # its last scalars: the job's metrics complete as it ends
            tensorboard.attempt_ended(job_id)

    loop.on_attempt_end = attempt_ended
    loop.dataset_cache_bytes = settings.dataset_cache_bytes
    dataset_files = DatasetFiles(settings.datasets_home)
    prefetch = DatasetPrefetch(
        store,
        dataset_files,
        settings.dataset_cache,
        settings.dataset_cache_bytes,
        # the local executor's attempts stage into this machine's cache; a Ray job's nodes
        # are known once it is placed
        enabled=executor.name == "local",
    )
    return Runtime(
        settings,
        store,
        blobs,
        loop,
        checkpoints,
        monitor,
        LogRetention(store, settings.home, settings.log_retention),
        telemetry,
        auth,
        reports,
        tune,
        SavedModels(store, checkpoints),
        ReplicaHub(store, telemetry.registry),
        dataset_files,
        tensorboard=tensorboard,
        prefetch=prefetch,
        file_work=file_pool(settings),
    )


def file_pool(settings: Settings | type[Settings]) -> WorkPool:
    """The pool that hashes and copies jobs' files for requests (``file_workers`` at once,
    ``file_queue`` waiting; :mod:`trainhouse.usecases.filework`)."""
    return WorkPool("trainhouse-files", workers=settings.file_workers, queue=settings.file_queue)


def _as_root() -> bool:
    """Whether this process runs as root (the jobs it starts do too)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0
