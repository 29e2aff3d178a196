"""The Store: every read and write of trainhouse's state, for SQLite and PostgreSQL alike.

A :class:`Store` is its :class:`~trainhouse.store.database.Database` (the engine, the schema,
the public :meth:`~trainhouse.store.database.Database.transaction`) with one repository per
concern, each owning its tables:

========================  ======================================================================
``store.jobs``            jobs, attempts, events; every state change (:mod:`.jobs`)
``store.checkpoints``     checkpoint records (:mod:`.checkpoints`)
``store.datasets``        datasets, their versions, the versions each job pins (:mod:`.datasets`)
``store.flows``           flows, the jobs a job waits for, the models it read (:mod:`.flows`)
``store.metrics``         metric series: ingest and downsampled reads (:mod:`.metrics`)
``store.media``           images, histograms and tables jobs log (:mod:`.media`)
``store.quotas``          per-user limits and fair-share usage (:mod:`.quotas`)
``store.accounts``        users, API tokens (hashes), the audit log (:mod:`.accounts`)
``store.system``          resource samples of nodes and jobs (:mod:`.system`)
``store.tracking``        MLflow experiments and runs, params and tags (:mod:`.tracking`)
``store.searches``        hyperparameter searches and their trials (:mod:`.searches`)
``store.models``          the model registry: models, versions, aliases (:mod:`.models`)
``store.runs``            the runs table: columns, filters, tags, notes, deletion (:mod:`.runs`)
``store.services``        served models and the jobs that run their replicas (:mod:`.services`)
========================  ======================================================================

Repositories hand out plain records (:mod:`.records`), never SQLAlchemy objects.
"""

from __future__ import annotations

from trainhouse.store.accounts import Accounts
from trainhouse.store.checkpoints import CheckpointRepo
from trainhouse.store.database import Database, MigrateMode
from trainhouse.store.datasets import DatasetRepo
from trainhouse.store.eventfiles import EventFilePositions
from trainhouse.store.flows import FlowRepo
from trainhouse.store.jobs import JobRepo
from trainhouse.store.media import MediaRepo
from trainhouse.store.metrics import MetricRepo
from trainhouse.store.models import ModelRepo
from trainhouse.store.quotas import QuotaRepo
from trainhouse.store.runs import RunsRepo
from trainhouse.store.searches import SearchRepo
from trainhouse.store.services import ServiceRepo
from trainhouse.store.system import SystemMetrics
from trainhouse.store.tracking import TrackingRepo

__all__ = ["Store"]


class Store(Database):
    """Everything trainhouse persists. Thread-safe: every operation takes its own connection."""

    def __init__(self, url: str, *, migrate: bool | MigrateMode = True) -> None:
        super().__init__(url, migrate=migrate)
        self.jobs = JobRepo(self)
        self.checkpoints = CheckpointRepo(self)
        self.metrics = MetricRepo(self)
        self.quotas = QuotaRepo(self)
        self.accounts = Accounts(self)
        self.system = SystemMetrics(self)
        self.tracking = TrackingRepo(self, self.jobs)
        self.searches = SearchRepo(self)
        self.models = ModelRepo(self)
        self.runs = RunsRepo(self)
        self.services = ServiceRepo(self)
        self.datasets = DatasetRepo(self)
        self.flows = FlowRepo(self)
        self.media = MediaRepo(self)
        self.event_files = EventFilePositions(self)  # the TensorBoard import's positions
