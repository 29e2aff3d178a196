"""What route handlers depend on: the running services and the per-job credential check."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Depends, Header, Request

from trainhouse.errors import Unauthorized
from trainhouse.layout import JobLayout
from trainhouse.monitoring.sampler import Sampler
from trainhouse.monitoring.telemetry import Telemetry
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.server.checkpoints import Checkpoints
from trainhouse.server.housekeeping import Housekeeper
from trainhouse.server.schemas import RowId
from trainhouse.server.settings import Settings
from trainhouse.service import Service
from trainhouse.store import BlobStore, Job, Store
from trainhouse.tokens import hash_token

if TYPE_CHECKING:
    from trainhouse.server.auth import Authenticator


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

    @property
    def background(self) -> list[Service]:
        """The app's background services, in the order they start (they stop in reverse):
        retention before the scheduler, whose last exits register checkpoints."""
        return [self.checkpoints, self.scheduler, self.monitor, self.housekeeper]

    def files(self, job_id: int) -> JobLayout:
        return JobLayout(self.settings.home, job_id)


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def job_credential(job: Job, authorization: str | None) -> None:
    """Raise unless ``authorization`` carries the job's current per-attempt token."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("this endpoint needs the job's credential (Authorization: Bearer ...)")
    given = hash_token(authorization.removeprefix("Bearer ").strip())
    if job.token_hash is None or not hmac.compare_digest(given, job.token_hash):
        raise Unauthorized(f"the credential is not valid for job {job.id}'s current attempt")


AuthHeader = Header(None, alias="Authorization", include_in_schema=False)


def reporting_job(
    job_id: RowId, authorization: str | None = AuthHeader, svc: Services = Depends(services)
) -> Job:
    """The job a request reports for, once its per-attempt credential checks out."""
    job = svc.store.jobs.get(job_id)
    job_credential(job, authorization)
    return job
